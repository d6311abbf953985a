"""One timeline when a plain script resumes: a Trainer.fit that died two batches after its last checkpoint,
resumed by a new process with ``latest_checkpoint="latest"``, shows each batch once in the store and in
TensorBoard; the dead run's reports after the checkpoint stay in the store, marked superseded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.helpers_paths import SUPPORT
from support.helpers_tensorboard import tensorboard_points
from trials_pytorch import LinearTrial, config, fit

from determined_trials.pytorch import Batch

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device")]

FIT: dict[str, Any] = {"max_length": Batch(8), "checkpoint_period": Batch(4), "validation_period": Batch(4),
                       "reporting_period": Batch(1)}

# the first run: the linear trial dies training batch 7 (after batches 5 and 6 were reported, and the
# checkpoint at 4), as a plain script in a process of its own; "latest" looks for runs of the same name
_FIRST_RUN = f"""
import sys
from trials_pytorch import LinearTrial, config, fit
from determined_trials.pytorch import Batch

class Dies(LinearTrial):
    def train_batch(self, batch, epoch_idx, batch_idx):
        if batch_idx == 6:
            raise RuntimeError("the first run dies")
        return super().train_batch(batch, epoch_idx, batch_idx)

fit(Dies, config(name="timeline"), sys.argv[1], **{{k: Batch(v) for k, v in {({k: v.value for k, v in FIT.items()})!r}.items()}})
"""


def test_a_new_process_resuming_latest_supersedes_the_dead_runs_reports(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.run([sys.executable, "-c", _FIRST_RUN, str(tmp_path)], env=env, capture_output=True,
                           text=True, timeout=300)
    assert first.returncode != 0 and "the first run dies" in first.stderr, first.stderr

    _, trainer, info = fit(LinearTrial, config(name="timeline"), tmp_path, latest_checkpoint="latest", **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    assert info["trial_id"] == 1  # the dead run's trial goes on
    training = info["training"]
    assert [r.steps_completed for r in training] == list(range(1, 9))
    assert [r.steps_completed for r in info["validation"]] == [4, 8]

    from determined_trials.core import LocalStore

    every = LocalStore(tmp_path).metrics(1, "training", include_superseded=True)
    assert [r.steps_completed for r in every if r.superseded_time is not None] == [5, 6]
    points = tensorboard_points(tmp_path / "tensorboard" / "experiment_1" / "trial_1")
    assert points["loss"] == [(r.steps_completed, pytest.approx(r.metrics["loss"])) for r in training]
