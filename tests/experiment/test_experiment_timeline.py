"""One timeline after a restart: a Core API trial of `det-trials experiment create` that crashes a step after
its last checkpoint is restarted from that checkpoint; the store's reads, the CLI and TensorBoard show each
step once, and the lost attempt's report stays in the store, marked superseded."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from support.helpers_experiment import create, make_context
from support.helpers_tensorboard import tensorboard_points

from determined_trials.cli.main import main
from determined_trials.core import LocalStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.usefixtures("cpu_device")]


def _cli(capsys: pytest.CaptureFixture[str], run_dir: Path, *argv: str) -> str:
    capsys.readouterr()
    assert main(["--run-dir", str(run_dir), "trial", "metrics", "1", *argv]) == 0
    return capsys.readouterr().out


def test_a_restart_after_a_crash_past_the_checkpoint_shows_each_step_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crash_dir = tmp_path / "crashes"
    crash_dir.mkdir()
    # checkpoints at steps 3 and 6; the first attempt reports step 4, then dies training step 5
    config, ctx = make_context(tmp_path, {"crash_at": 5, "crash_times": 1, "crash_dir": str(crash_dir),
                                          "ckpt_every": 3})
    run_dir = tmp_path / "runs"
    assert create(run_dir, config, ctx) == 0
    store = LocalStore(run_dir)
    assert store.trial(1).restarts == 1
    training = store.metrics(1, "training")
    assert [r.steps_completed for r in training] == [1, 2, 3, 4, 5, 6]
    assert [r.steps_completed for r in store.metrics(1, "validation")] == [3, 6]
    every = store.metrics(1, "training", include_superseded=True)
    assert [r.steps_completed for r in every if r.superseded_time is not None] == [4]
    assert len(every) == 7

    shown = json.loads(_cli(capsys, run_dir, "--group", "training", "--json"))
    assert [r["steps_completed"] for r in shown] == [1, 2, 3, 4, 5, 6]
    audit = list(csv.DictReader(io.StringIO(_cli(capsys, run_dir, "--group", "training", "--all-attempts", "--csv"))))
    assert [(r["steps_completed"], bool(r["superseded_time"])) for r in audit] == [
        ("1", False), ("2", False), ("3", False), ("4", True), ("4", False), ("5", False), ("6", False)]

    points = tensorboard_points(run_dir / "tensorboard" / "experiment_1" / "trial_1")
    assert points["w"] == [(r.steps_completed, pytest.approx(r.metrics["w"])) for r in training]
    assert [step for step, _ in points["val_loss"]] == [3, 6]
