"""Trials of a runner or a script killed with kill -9 become resumable (dead owner detection by
pid + start time), and the tables say what is true: STATUS only for running trials,
``max_concurrent_trials`` honoured without ``--max-parallel``, ``continue`` remembers ``--max-parallel``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.helpers_experiment import kill_runner, make_context, start_runner

from determined_trials.cli.main import main
from determined_trials.config import load_config
from determined_trials.core import LocalStore
from determined_trials.core.store._owner import claim_experiment, owner_alive, release_dead_owners
from determined_trials.experiment import _setup


def _dead_pid() -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait(timeout=60)
    return proc.pid, started


def test_owner_alive_uses_pid_and_start_time() -> None:
    me = psutil.Process()
    assert owner_alive(me.pid, me.create_time())
    assert not owner_alive(me.pid, me.create_time() - 100)  # the pid was reused by another process
    assert not owner_alive(*_dead_pid())


def test_a_killed_scripts_experiment_is_released_as_paused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    alive = store.create_experiment(name="mine", config={})
    store.create_trial(experiment_id=alive, hparams={}, seed=1)
    claim_experiment(store, alive)
    dead = store.create_experiment(name="killed", config={})
    trial = store.create_trial(experiment_id=dead, hparams={}, seed=1)
    store.set_experiment_owner(dead, *_dead_pid())
    assert release_dead_owners(store) == [dead]
    assert store.experiment(alive).state == "ACTIVE"
    assert store.experiment(dead).state == "PAUSED" and store.trial(trial).state == "PAUSED"
    assert "latest_checkpoint" in (store.trial(trial).reason or "")


@pytest.mark.slow
def test_continue_after_the_runner_was_killed_with_sigkill(tmp_path: Path) -> None:
    config, ctx = make_context(tmp_path, {"sleep": 0.05, "ckpt_every": 2}, searcher={
        "name": "single", "metric": "loss", "max_length": 12})
    run_dir = tmp_path / "runs"
    kill_runner(start_runner(run_dir, config, ctx, tmp_path / "create.out"))
    store = LocalStore(run_dir)
    assert store.experiment(1).state == "ACTIVE"  # what the killed runner left
    assert main(["--run-dir", str(run_dir), "trial", "list"]) == 0
    assert store.experiment(1).state == "PAUSED" and store.trial(1).state == "PAUSED"
    assert main(["--run-dir", str(run_dir), "experiment", "continue", "1", "--no-progress"]) == 0
    assert store.experiment(1).state == "COMPLETED" and store.trial(1).state == "COMPLETED"
    steps = [m.steps_completed for m in store.metrics(1, "training")]
    assert steps[-1] == 12 and sorted(set(steps)) == list(range(1, 13))


def test_status_is_shown_only_for_running_trials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = LocalStore(tmp_path)
    exp = store.create_experiment(name="e", config={})
    done, running = (store.create_trial(experiment_id=exp, hparams={}, seed=s) for s in (1, 2))
    claim_experiment(store, exp)
    for trial in (done, running):
        store.set_trial_status(trial, "training")
    store.set_trial_state(done, "COMPLETED")
    assert main(["--run-dir", str(tmp_path), "trial", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert "training" not in rows[str(done)] and "training" in rows[str(running)]


def _grid(**searcher: Any) -> dict[str, Any]:
    return {"entrypoint": "python3 x.py", "hyperparameters": {"a": {"type": "categorical", "vals": [1, 2, 3]}},
            "searcher": {"name": "grid", "metric": "loss", "max_length": 1, **searcher}}


def test_max_concurrent_trials_in_the_config_runs_trials_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(_setup, "visible_gpus", lambda: [])
    assert _setup._configured_parallel(load_config(_grid(max_concurrent_trials=3))) == 3
    assert _setup._configured_parallel(load_config(_grid())) is None  # Determined's default 16: one at a time
    assert _setup.parallelism(load_config(_grid(max_concurrent_trials=3)), 3) == 3


def test_the_config_reference_says_what_an_unset_max_concurrent_trials_does(monkeypatch: pytest.MonkeyPatch) -> None:
    from determined_trials.config._reference import render_reference

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(_setup, "visible_gpus", lambda: [])
    unset = load_config(_grid())
    assert unset.searcher.max_concurrent_trials == 16  # Determined's default, which Ray runs honour
    assert _setup.parallelism(unset, _setup._configured_parallel(unset)) == 1
    row = next(x for x in render_reference().splitlines() if x.startswith("| `max_concurrent_trials` |"))
    assert "Locally, trials run one at a time unless this key" in row and "On Ray (`--ray`) the default 16" in row
    row = next(x for x in render_reference().splitlines() if x.startswith("| `max_slots` |"))
    assert "ignored locally" not in row and "max_slots // slots_per_trial" in row


def test_continue_remembers_max_parallel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class _Runner:
        def __init__(self, **kwargs: Any) -> None:
            seen.update(kwargs)

        def load_state_dict(self, state: dict[str, Any]) -> None:
            pass

        def run(self) -> str:
            return "COMPLETED"

    store = LocalStore(tmp_path)
    exp = store.create_experiment(name="e", config=_grid(), model_dir=str(tmp_path / "model"))
    store.set_searcher_state(exp, {"version": 1, "max_parallel": 2})
    store.set_experiment_state(exp, "PAUSED")
    monkeypatch.setattr(_setup, "ExperimentRunner", _Runner)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(_setup, "visible_gpus", lambda: [])
    _setup.continue_experiment(exp, run_dir=tmp_path)
    assert seen["max_parallel"] == 2 and seen["requested_parallel"] == 2
