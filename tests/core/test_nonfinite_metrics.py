"""NaN/inf metrics: stored, with one warning per metric name; a NaN searcher metric is never the
"best" checkpoint. An empty training set gets our error, not torch's num_samples=0."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
from trials_pytorch import ScriptedValidationTrial, config, fit

import determined_trials as det
from determined_trials import pytorch
from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)


def test_non_finite_metrics_warn_once_per_name(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    conf = {"searcher": {"name": "single", "metric": "val_loss", "max_length": 4}}
    with caplog.at_level(logging.WARNING, logger="determined_trials.core"), \
            det.core.init(config=conf, run_dir=tmp_path) as ctx:
        for step in (1, 2, 3):
            ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": math.inf, "acc": 0.5})
            ctx.train.report_validation_metrics(steps_completed=step, metrics={"val_loss": math.nan})
        trial_id = ctx.info.trial.trial_id
    warnings = [r.getMessage() for r in caplog.records if "warned once per metric" in r.getMessage()]
    assert len(warnings) == 2 and any("'loss' is inf" in w for w in warnings) and any("'val_loss' is nan" in w
                                                                                     for w in warnings)
    stored = det.core.LocalStore(tmp_path).metrics(trial_id, group="validation")
    assert len(stored) == 3 and all(math.isnan(r.metrics["val_loss"]) for r in stored)


def test_a_nan_searcher_metric_is_never_the_best_checkpoint(tmp_path: Path) -> None:
    _, _, info = fit(lambda ctx: ScriptedValidationTrial(ctx, values=[math.nan, math.nan, 2.0]),
                     config({"global_batch_size": 2}), tmp_path, max_length=Batch(6),
                     validation_period=Batch(2), checkpoint_policy="best")
    # validations at 2 and 4 are NaN: no "best" checkpoint for them; at 6 the first real value is
    assert [c.steps_completed for c in info["checkpoints"]] == [6]


def test_an_empty_training_set_gets_a_clear_error() -> None:
    with pytest.raises(ValueError, match="empty dataset"):
        pytorch.DataLoader([], batch_size=2, shuffle=True)
