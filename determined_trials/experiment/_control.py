"""Pause, continue and kill a local experiment from outside its runner (`det-trials experiment kill`, the UI)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from determined_trials.core.store import LocalStore, RunState, owner_alive, release_dead_owners
from determined_trials.experiment._errors import ExperimentError
from determined_trials.experiment._runner import KILLED_REASON

__all__ = ["CONTINUE_LOG", "activate_experiment", "kill_experiment", "live_owner", "pause_experiment"]

KILL_WAIT_S = 120.0
CONTINUE_LOG = "continue.log"


def live_owner(store: LocalStore, experiment_id: int) -> int | None:
    """The pid of the process running the experiment, or ``None`` (dead owners are released first)."""
    release_dead_owners(store)
    owner = store.experiment_owner(experiment_id)
    if store.experiment(experiment_id).state == RunState.ACTIVE and owner is not None and owner_alive(*owner):
        return owner[0]
    return None


def stop_runner(experiment_id: int, pid: int, wait_s: float = KILL_WAIT_S) -> None:
    """One SIGTERM, then wait until the runner is gone: seeing its experiment CANCELED, it kills its trials at
    once. Not again: a second signal could reach it after it restored the default handler, killing it before
    it reports."""
    try:
        runner = psutil.Process(pid)
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=wait_s)
        return
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        pass
    raise ExperimentError(f"experiment {experiment_id}'s process {pid} did not stop within {wait_s:.0f} s; "
                          f"end it with `kill -9 {pid}`")


def kill_experiment(store: LocalStore, experiment_id: int) -> None:
    """Mark the experiment CANCELED, stop its process (if it runs: seeing CANCELED, the runner kills its trials
    and ends CANCELED, not PAUSED) and mark its unfinished trials CANCELED."""
    exp = store.experiment(experiment_id)
    if exp.state not in RunState.UNFINISHED:
        raise ExperimentError(f"experiment {exp.id} is {exp.state} already; nothing to kill")
    pid = live_owner(store, exp.id)
    store.set_experiment_state(exp.id, RunState.CANCELED, KILLED_REASON)  # first: the runner reads it on the signal
    if pid is not None:
        stop_runner(exp.id, pid)
    for trial in store.trials(exp.id):
        if trial.state in RunState.UNFINISHED:
            store.set_trial_state(trial.id, RunState.CANCELED, "experiment killed")
    store.set_experiment_state(exp.id, RunState.CANCELED, KILLED_REASON)


def pause_experiment(store: LocalStore, experiment_id: int) -> None:
    """Ask the experiment's runner to pause (one SIGTERM, as Ctrl-C): it checkpoints its trials and records
    PAUSED shortly after. Only experiments run by `det-trials experiment create` can be paused this way."""
    exp = store.experiment(experiment_id)
    if exp.model_dir is None:
        raise ExperimentError(f"experiment {exp.id} is a plain script's run, not a runner's: stop it in its "
                              "terminal (Ctrl-C) instead")
    pid = live_owner(store, exp.id)
    if pid is None:
        raise ExperimentError(f"experiment {exp.id} is {store.experiment(exp.id).state}, not running: "
                              "nothing to pause")
    os.kill(pid, signal.SIGTERM)


def activate_experiment(store: LocalStore, experiment_id: int) -> int:
    """Continue a PAUSED experiment in the background: `det-trials experiment continue` in a session of its own,
    its output in the experiment's folder (``continue.log``); returns its pid."""
    release_dead_owners(store)
    exp = store.experiment(experiment_id)
    if exp.state != RunState.PAUSED or exp.searcher_state is None or exp.model_dir is None:
        raise ExperimentError(f"experiment {exp.id} is {exp.state}, not a paused experiment of "
                              "`det-trials experiment create`: only those can continue")
    log_path = Path(exp.model_dir).parent / CONTINUE_LOG
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "determined_trials.cli.main", "--run-dir", str(store.path), "experiment",
             "continue", str(exp.id), "--no-progress"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    _wait_for_start(store, exp.id, proc)
    return proc.pid


def _wait_for_start(store: LocalStore, experiment_id: int, proc: subprocess.Popen[bytes],
                    wait_s: float = 120.0) -> None:
    """Return once the continued runner recorded the experiment ACTIVE (or raise if it exited first)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if store.experiment(experiment_id).state == RunState.ACTIVE:
            return
        code = proc.poll()
        if code is not None:
            raise ExperimentError(f"`det-trials experiment continue {experiment_id}` exited with {code} before "
                                  "starting; see its output in the experiment's folder, " + CONTINUE_LOG)
        time.sleep(0.05)
