"""TensorBoard through the trackers' outbox, for a trial with no MLflow or W&B (a thread of the chief sends): a
report reaches the event file within seconds with no checkpoint covering it; after a kill -9 past the checkpoint
and a restart that reports other values, TensorBoard shows each step once, with the store's values."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.helpers_tensorboard import tensorboard_points
from support.helpers_trackers import wait_for

import determined_trials as det
from determined_trials.core import LocalStore

pytestmark = [pytest.mark.timeout(300)]

_CONFIG: dict[str, Any] = {"name": "tb-live", "searcher": {"name": "single", "metric": "loss", "max_length": 8},
                           "hyperparameters": {"lr": 0.1}, "reproducibility": {"experiment_seed": 3}}


def _logdir(run_dir: Path) -> Path:
    return run_dir / "tensorboard" / "experiment_1" / "trial_1"


def _loss(run_dir: Path) -> list[tuple[int, float]]:
    return tensorboard_points(_logdir(run_dir)).get("loss", []) if _logdir(run_dir).is_dir() else []


def test_each_report_reaches_tensorboard_within_5_s_with_no_checkpoint(tmp_path: Path) -> None:
    waits = []
    tensorboard_points(tmp_path)  # the reader's imports (TensorFlow's, seconds) before anything is timed
    with det.core.init(config=_CONFIG, run_dir=tmp_path) as ctx:
        for step in range(1, 9):
            ctx.train.report_training_metrics(step, {"loss": 1.0 / step})
            waits.append(wait_for(f"step {step} in TensorBoard", lambda s=step: _loss(tmp_path)[-1:] == [
                (s, pytest.approx(1.0 / s))], 60))
            time.sleep(0.3 if step % 3 else 0.05)  # the pace of the reports (not a synchronisation)
        assert LocalStore(tmp_path).checkpoints(trial_id=1) == []
    waits.sort()
    assert waits[math.ceil(0.95 * len(waits)) - 1] <= 5.0, waits
    assert _loss(tmp_path) == [(s, pytest.approx(1.0 / s)) for s in range(1, 9)]


# reports steps 1..5 (a checkpoint at 2 only) and a custom event of its own at each step, then waits to be killed
_KILLED = """
import sys, time
import determined_trials as det
from torch.utils.tensorboard import SummaryWriter
config = {"name": "tb-live", "searcher": {"name": "single", "metric": "loss", "max_length": 8},
          "hyperparameters": {"lr": 0.1}, "reproducibility": {"experiment_seed": 3}}
with det.core.init(config=config, run_dir=sys.argv[1]) as ctx:
    own = SummaryWriter(str(ctx.train.get_tensorboard_path()))
    for step in range(1, 6):
        ctx.train.report_training_metrics(step, {"loss": 1.0 / step})
        own.add_scalar("own", 100.0 + step, step)
        if step == 2:
            with ctx.checkpoint.store_path({"steps_completed": 2}) as (path, _):
                (path / "state.txt").write_text("2")
    own.flush()
    ctx.train.flush_reports()
    time.sleep(600)
"""


def test_a_restart_after_a_kill_9_shows_each_step_once_with_the_store_values(tmp_path: Path) -> None:
    """Killed once TensorBoard had steps 1..5 (past the checkpoint at 2); the restart reports 3..8 with other
    values: TensorBoard drops the killed attempt's 3..5 (its own events through ``get_tensorboard_path`` too) and
    shows each step once, equal to the store's current rows."""
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(tmp_path)], env=os.environ.copy())
    try:
        def sent_to_5() -> bool:
            assert proc.poll() is None, "the trial process ended"
            points = tensorboard_points(_logdir(tmp_path)) if _logdir(tmp_path).is_dir() else {}
            return [s for s, _ in points.get("loss", [])] == [1, 2, 3, 4, 5] and len(points.get("own", [])) == 5
        wait_for("steps 1..5 in TensorBoard", sent_to_5, 120)
    finally:
        proc.kill()
        proc.wait(timeout=60)

    with det.core.init(config=_CONFIG, run_dir=tmp_path, latest_checkpoint="latest") as ctx:
        assert ctx.info.trial.trial_id == 1
        for step in range(3, 9):
            ctx.train.report_training_metrics(step, {"loss": 10.0 / step})
    store = LocalStore(tmp_path)
    rows = [(m.steps_completed, float(m.metrics["loss"])) for m in store.metrics(1, "training")]
    assert rows == [(1, 1.0), (2, 0.5)] + [(s, 10.0 / s) for s in range(3, 9)]
    points = tensorboard_points(_logdir(tmp_path))
    assert points["loss"] == [(s, pytest.approx(v)) for s, v in rows]  # each step once, the store's values
    assert points["own"] == [(1, 101.0), (2, 102.0)]  # the killed attempt's own events after the checkpoint dropped
    run = store.tracker_run(1, "tensorboard")
    assert run is not None and run["run_id"] == str(_logdir(tmp_path)) and run["progress"]["held"] == {}


def test_tensorboard_manual_mode_leaves_the_folder_to_the_trial(tmp_path: Path) -> None:
    with det.core.init(config=_CONFIG, run_dir=tmp_path, tensorboard_mode=det.core.TensorboardMode.MANUAL) as ctx:
        ctx.train.report_training_metrics(1, {"loss": 1.0})
    assert not _logdir(tmp_path).exists() or not list(_logdir(tmp_path).glob("events.out.tfevents.*"))
    assert LocalStore(tmp_path).tracker_run(1, "tensorboard") is None


# a trial that writes events of its own in __init__, in a file named before the harness's (so TensorBoard reads it
# first, as when the trial's writer opens before the harness's sender has)
_OWN_FIRST = """
import pathlib, time
from torch.utils.tensorboard import SummaryWriter
from trials_pytorch import LinearTrial


class OwnFirstTrial(LinearTrial):
    def __init__(self, context):
        super().__init__(context)
        folder = context.get_tensorboard_path()
        own = SummaryWriter(str(folder))
        for step in range(1, 4):
            own.add_scalar("own", 100.0 + step, step)
        own.close()
        for path in pathlib.Path(folder).glob("events.out.tfevents.*"):
            path.rename(path.with_name(f"events.out.tfevents.{int(time.time()) - 60}.own.0"))
"""


@pytest.mark.usefixtures("cpu_device")
def test_a_trial_s_first_process_drops_none_of_its_own_events_whichever_file_came_first(tmp_path: Path) -> None:
    """A launched trial's first process has no lost attempt to rewind: its event file has no session start, so
    the trial's own event file (named before the harness's here) keeps every event; the trial does not wait for
    the sender's first pass."""
    import yaml
    from support.helpers_experiment import create
    from support.helpers_paths import SUPPORT
    from trials_pytorch import config as trial_config

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "trials_pytorch.py").write_text((SUPPORT / "trials_pytorch.py").read_text())
    (ctx / "model_def.py").write_text(_OWN_FIRST)
    conf = trial_config(name="first", entrypoint="model_def:OwnFirstTrial", max_restarts=0, scheduling_unit=1,
                        searcher={"name": "single", "metric": "validation_loss", "max_length": {"batches": 4}})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(conf))
    run = tmp_path / "run"
    assert create(run, tmp_path / "config.yaml", ctx) == 0
    points = tensorboard_points(_logdir(run))
    assert points["own"] == [(s, pytest.approx(100.0 + s)) for s in range(1, 4)]
    rows = [(m.steps_completed, float(m.metrics["loss"])) for m in LocalStore(run).metrics(1, "training")]
    assert [s for s, _ in rows] == [1, 2, 3, 4]
    assert points["loss"] == [(s, pytest.approx(v)) for s, v in rows]
