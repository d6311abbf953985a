"""A plain Core API script resumed with ``det.core.init(latest_checkpoint=...)`` continues its own trial:
one experiment, the trial COMPLETED, ``info.latest_checkpoint`` naming the checkpoint (issue 25, item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers_paths import REPO

import determined_trials as det

CONFIG = {
    "name": "core-resume",
    "hyperparameters": {"lr": 0.1},
    "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 20}},
}


def _first_run(run_dir: Path) -> str:
    """Train 10 of 20 batches, checkpoint, then stop as a preempted run does."""
    with det.core.init(config=CONFIG, run_dir=run_dir) as ctx:
        assert ctx.info.latest_checkpoint is None
        ctx.train.report_training_metrics(10, {"loss": 1.0})
        with ctx.checkpoint.store_path({"steps_completed": 10}) as (path, uuid):
            (path / "weights").write_text("10")
        ctx.preempt.request_preemption()
        assert ctx.preempt.should_preempt()
    return uuid


@pytest.mark.parametrize("how", ["latest", "uuid"])
def test_a_resumed_core_api_script_continues_its_trial(tmp_path: Path, how: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    uuid = _first_run(tmp_path)
    store = det.core.LocalStore(tmp_path)
    (first,) = store.experiments()
    assert first.state == "PAUSED"
    with det.core.init(config=CONFIG, run_dir=tmp_path, latest_checkpoint="latest" if how == "latest" else uuid) as ctx:
        assert ctx.info.latest_checkpoint == uuid
        assert ctx.info.trial.experiment_id == first.id
        with ctx.checkpoint.restore_path(uuid) as path:
            assert (path / "weights").read_text() == "10"
        ctx.train.report_training_metrics(20, {"loss": 0.5})
        for op in ctx.searcher.operations():
            op.report_completed(0.5)
    (experiment,) = store.experiments()  # no second experiment; the first is not left PAUSED
    assert experiment.id == first.id and experiment.state == "COMPLETED"
    (trial,) = store.trials(first.id)
    assert trial.state == "COMPLETED"
    assert [m.steps_completed for m in store.metrics(trial.id, "training")] == [10, 20]
    assert f"resuming trial {trial.id} from checkpoint {uuid}" in capsys.readouterr().err


def test_latest_without_a_checkpoint_starts_from_scratch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path, latest_checkpoint="latest") as ctx:
        assert ctx.info.latest_checkpoint is None
        trial_id = ctx.info.trial.trial_id
    assert f"no checkpoint to resume from in {tmp_path}: trial {trial_id} starts from scratch" in capsys.readouterr().err


def test_the_trial_is_settled_by_the_resume_or_by_its_first_use(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """What a trainer's ``fit(latest_checkpoint=...)`` does after ``init``: a context whose trial nothing used yet
    continues the checkpoint's trial (the run it registered is dropped); one whose trial was already used (here
    ``info`` was read) stays that trial and resumes the checkpoint as its own, saying so."""
    from determined_trials.core._resume import continue_bare_run

    uuid = _first_run(tmp_path / "unused")
    store = det.core.LocalStore(tmp_path / "unused")
    with det.core.init(config=CONFIG, run_dir=tmp_path / "unused") as ctx:
        assert [e.id for e in store.experiments()] == [1, 2]  # registered, not yet settled
        assert continue_bare_run(ctx, "latest") == uuid
        assert (ctx.info.trial.trial_id, ctx.info.latest_checkpoint) == (1, uuid)
        ctx.train.report_training_metrics(20, {"loss": 0.5})
    assert [e.id for e in store.experiments()] == [1]
    assert [m.steps_completed for m in store.metrics(1, "training")] == [10, 20]

    uuid = _first_run(tmp_path / "used")
    store = det.core.LocalStore(tmp_path / "used")
    with det.core.init(config=CONFIG, run_dir=tmp_path / "used") as ctx:
        mine = ctx.info.trial
        assert continue_bare_run(ctx, "latest") == uuid
        assert ctx.info.trial == mine and ctx.info.latest_checkpoint == uuid
        ctx.train.report_training_metrics(20, {"loss": 0.5})
    assert [e.id for e in store.experiments()] == [1, 2]
    assert [m.steps_completed for m in store.metrics(mine.trial_id, "training")] == [20]
    assert f"this run had already used its own trial {mine.trial_id}" in caplog.text


@pytest.mark.slow
def test_the_core_api_example_resumes_its_own_trial(tmp_path: Path) -> None:
    """`make example-core` as a user runs it: preempted after 3 epochs, resumed with --resume latest."""
    script = REPO / "examples" / "core_api_digits" / "train.py"
    run_dir = tmp_path / "runs"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the example trains on the CPU
    for extra in (["--preempt-after-epochs", "3"], ["--resume", "latest"]):
        subprocess.run([sys.executable, str(script), "--run-dir", str(run_dir), *extra], check=True, timeout=600,
                       cwd=tmp_path, env=env, capture_output=True, text=True)
    store = det.core.LocalStore(run_dir)
    (experiment,) = store.experiments()
    assert experiment.state == "COMPLETED"
    (trial,) = store.trials(experiment.id)
    assert trial.state == "COMPLETED"
