"""Pause (SIGTERM to `det-trials experiment create`) then `experiment continue`: the same final result
as an uninterrupted experiment; several trials at once with --max-parallel."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.helpers_experiment import DET_TRIALS, create, final_states, make_context

from determined_trials.cli.main import main
from determined_trials.core import LocalStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.usefixtures("cpu_device")]

_HPARAMS = {"lr": {"type": "categorical", "vals": [0.2, 0.6]}, "sleep": 0.05, "ckpt_every": 5}
_SEARCHER = {"name": "grid", "metric": "loss", "max_length": 12}


def _wait_for_steps(run_dir: Path, trial_id: int, steps: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "store.sqlite").exists():
            store = LocalStore(run_dir)
            try:
                if len(store.metrics(trial_id, "training")) >= steps:
                    return
            except KeyError:
                pass
            finally:
                store.close()
        time.sleep(0.05)
    raise AssertionError(f"trial {trial_id} did not reach {steps} steps within {timeout} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_pause_then_continue_gives_the_uninterrupted_result(tmp_path: Path) -> None:
    config, ctx = make_context(tmp_path, _HPARAMS, searcher=_SEARCHER)
    run_dir = tmp_path / "runs"
    with open(tmp_path / "create.out", "wb") as out:
        proc = subprocess.Popen([*DET_TRIALS, "--run-dir", str(run_dir), "experiment", "create", str(config),
                                 str(ctx), "--no-progress"], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait_for_steps(run_dir, 1, 3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 75
    finally:
        _stop(proc)
    text = (tmp_path / "create.out").read_text()
    assert "pausing" in text and "Experiment 1: PAUSED" in text
    store = LocalStore(run_dir)
    assert store.experiment(1).state == "PAUSED"
    assert [t.state for t in store.trials(1)] == ["PAUSED"]
    paused_at = store.latest_checkpoint(1)
    assert paused_at is not None and 3 <= paused_at.steps_completed < 12

    assert main(["--run-dir", str(run_dir), "experiment", "continue", "1", "--no-progress"]) == 0
    assert store.experiment(1).state == "COMPLETED"
    assert [t.state for t in store.trials(1)] == ["COMPLETED", "COMPLETED"]
    assert [m.steps_completed for m in store.metrics(1, "training")] == list(range(1, 13))
    log = (run_dir / "experiments" / "1" / "trial_1.log").read_text()
    assert f"preempted at step {paused_at.steps_completed}" in log
    assert f"resumed at step {paused_at.steps_completed}" in log

    clean_cfg, clean_ctx = make_context(tmp_path / "clean", _HPARAMS, searcher=_SEARCHER)
    assert create(tmp_path / "clean-runs", clean_cfg, clean_ctx) == 0
    assert final_states(store, 1) == final_states(LocalStore(tmp_path / "clean-runs"), 1)


def test_continue_refuses_an_experiment_that_is_not_paused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, ctx = make_context(tmp_path, {}, searcher={"name": "single", "metric": "loss", "max_length": 2})
    assert create(tmp_path / "runs", config, ctx) == 0
    assert main(["--run-dir", str(tmp_path / "runs"), "experiment", "continue", "1"]) == 2
    assert "COMPLETED, not PAUSED" in capsys.readouterr().err


def test_max_parallel_runs_trials_at_once(tmp_path: Path) -> None:
    hparams = {"lr": {"type": "categorical", "vals": [0.2, 0.4, 0.6, 0.8]}, "sleep": 0.1}
    config, ctx = make_context(tmp_path, hparams, searcher={"name": "grid", "metric": "loss", "max_length": 5})
    started = time.monotonic()
    assert create(tmp_path / "runs", config, ctx, "--max-parallel", "2") == 0
    elapsed = time.monotonic() - started
    store = LocalStore(tmp_path / "runs")
    trials = store.trials(1)
    assert [t.state for t in trials] == ["COMPLETED"] * 4
    overlaps = sum(1 for a in trials for b in trials
                   if a.id < b.id and a.end_time is not None and b.start_time < a.end_time)
    assert overlaps >= 2, f"trials did not overlap (took {elapsed:.1f} s)"
