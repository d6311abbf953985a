"""A trial that completes no searcher operation (Determined 0.38's Core API tutorials and ASHA by
``time_metric``: validation reports only): the runner takes the searcher metric from its validations
when the config has no ``searcher.max_length``, and says a trial "exited without reporting the searcher
metric" only when that is true."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.helpers_experiment import create

from determined_trials.core import LocalStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = '''
import determined_trials as det

with det.core.init() as ctx:
    hp = ctx.info.trial.hparams
    x = 0
    for batch in range(1, 9):
        x += hp["increment_by"]
        if hp["report"] and batch % 2 == 0:
            ctx.train.report_validation_metrics(steps_completed=batch, metrics={"x": x, "batches": batch})
'''


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], hparams: dict[str, Any],
         searcher: dict[str, Any]) -> tuple[LocalStore, str]:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "script.py").write_text(SCRIPT)
    config = {"name": "t", "entrypoint": "python3 script.py", "hyperparameters": hparams, "max_restarts": 0,
              "searcher": {"metric": "x", "smaller_is_better": False, **searcher},
              "reproducibility": {"experiment_seed": 3}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert create(tmp_path / "runs", path, ctx) == 0
    out = capsys.readouterr()
    return LocalStore(tmp_path / "runs"), out.out + out.err


def test_asha_by_time_metric_takes_the_metric_from_validations_and_promotes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, text = _run(tmp_path, capsys, {"increment_by": {"type": "int", "minval": 1, "maxval": 8}, "report": True},
                       {"name": "adaptive_asha", "time_metric": "batches", "max_time": 8, "max_trials": 4,
                        "max_rungs": 2, "divisor": 2, "mode": "aggressive"})
    assert "exited without" not in text, text
    trials = store.trials(1)
    assert len(trials) == 4 and all(t.state == "COMPLETED" and t.reason is None for t in trials), text
    assert "training to 8 batches" in text  # the rung's metric (x at batches 4) promoted someone


@pytest.mark.parametrize("report", [True, False])
def test_without_max_length_nothing_is_expected_of_a_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], report: bool
) -> None:
    store, text = _run(tmp_path, capsys, {"increment_by": 2, "report": report}, {"name": "single"})
    assert "exited without" not in text, text
    (trial,) = store.trials(1)
    assert (trial.state, trial.reason) == ("COMPLETED", None)


def test_with_max_length_a_trial_that_completes_no_operation_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, text = _run(tmp_path, capsys, {"increment_by": 2, "report": True},
                       {"name": "single", "max_length": {"batches": 8}})
    assert "trial 1 exited without reporting the searcher metric for length 8" in text, text
    assert store.trial(1).reason == "exited without reporting the searcher metric for length 8"
