"""Helpers for the dashboard tests: a store written directly with the store API, and `det-trials ui` as a real
server on a free loopback port (stopped by the caller)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from determined_trials.core import LocalStore

__all__ = ["EVIL", "add_origins", "login_url", "make_big_store", "make_store", "running_ui"]

EVIL = '<img src=x onerror="window.__pwned=1">'


def make_store(run_dir: Path, *, trials: int = 3, training_rows: int = 50, validation_rows: int = 10,
               name: str = "demo") -> LocalStore:
    """One experiment (a plain script's, no runner) with ``trials`` trials: hyperparameters lr (number) and
    opt (string), training loss/accuracy, validation loss, a checkpoint per trial; trial 1 is COMPLETED."""
    store = LocalStore(run_dir)
    config = {"name": name, "searcher": {"name": "grid", "metric": "validation_loss", "smaller_is_better": True,
                                         "max_length": training_rows}}
    exp = store.create_experiment(name=name, config=config)
    for i in range(trials):
        tid = store.create_trial(experiment_id=exp, hparams={"lr": 0.1 * (i + 1), "opt": ["sgd", "adam"][i % 2],
                                                             "net": {"width": 8 * (i + 1)}}, seed=i)
        reports = [{"group": "training", "steps_completed": s + 1, "reported_time": time.time(),
                    "metrics": {"loss": 1.0 / (s + 1) + 0.01 * i, "accuracy": s / training_rows}}
                   for s in range(training_rows)]
        every = max(training_rows // max(validation_rows, 1), 1)
        reports += [{"group": "validation", "steps_completed": (v + 1) * every, "reported_time": time.time(),
                     "metrics": {"validation_loss": 2.0 / (v + 1) + 0.1 * i}} for v in range(validation_rows)]
        store.add_metrics_reports(trial_id=tid, reports=reports)
        store.add_checkpoint(uuid=f"ckpt-{tid}-{'0' * 8}", trial_id=tid, steps_completed=training_rows,
                             metadata={"steps_completed": training_rows}, resources={"state.json": 1536, "w": 10},
                             storage="shared_fs")
        store.set_trial_progress(tid, 0.5)
    store.set_trial_state(1, "COMPLETED")
    return store


def add_origins(store: LocalStore) -> tuple[int, int, int]:
    """To ``make_store``'s run folder: a fork of trial 2 (its checkpoint) and an optuna search warm-started from
    experiment 1 and the fork; (fork's experiment, fork's trial, the search's experiment)."""
    fork = store.create_experiment(name="fork", config={"searcher": {"name": "single", "metric": "loss"}})
    child = store.create_trial(experiment_id=fork, hparams={}, seed=1, parent_trial_id=2,
                               parent_checkpoint="ckpt-2-00000000")
    study = store.create_experiment(name="study", config={"searcher": {
        "name": "optuna", "metric": "loss", "warm_start": {"experiments": [1, fork]}}})
    return fork, child, study


def make_big_store(run_dir: Path, *, trials: int = 200, training_rows: int = 4_500, validation_rows: int = 500) -> None:
    """One experiment of ``trials`` trials × (``training_rows`` + ``validation_rows``) metric reports, a checkpoint
    each, and a 200,000-line log for trial 1: the dashboard's scale test."""
    store = LocalStore(run_dir)
    config = {"name": "big", "searcher": {"name": "random", "metric": "validation_loss", "max_length": training_rows}}
    exp = store.create_experiment(name="big", config=config)
    for i in range(trials):
        tid = store.create_trial(experiment_id=exp, hparams={"lr": 10 ** (-4 + 3 * i / trials), "layers": 1 + i % 4,
                                                             "optimizer": ["sgd", "adam", "rmsprop"][i % 3]}, seed=i)
        scale = 1 + (i % 17) / 10
        reports = [{"group": "training", "steps_completed": s, "reported_time": 0.0,
                    "metrics": {"loss": scale / s, "accuracy": 1 - 1 / s, "lr": 0.1}} for s in range(1, training_rows + 1)]
        reports += [{"group": "validation", "steps_completed": v * 9, "reported_time": 0.0,
                     "metrics": {"validation_loss": scale / v + i / 1000, "validation_accuracy": 1 - 1 / v}}
                    for v in range(1, validation_rows + 1)]
        store.add_metrics_reports(trial_id=tid, reports=reports)
        store.add_checkpoint(uuid=f"big-{tid}", trial_id=tid, steps_completed=training_rows, metadata={},
                             resources={"model.pt": 1 << 20}, storage="shared_fs")
        store.set_trial_progress(tid, (i % 10) / 10)
    log = run_dir / "experiments" / str(exp) / "trial_1.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"step {s} loss {1 / s}\n" for s in range(1, 200_001)))
    store.close()


def login_url(base: str, token: str, path: str = "/") -> str:
    """The address `det-trials ui` prints (with its token once) for ``path``."""
    return f"{base}{path}?token={token}" if token else f"{base}{path}"


@contextmanager
def running_ui(run_dir: Path, *extra: str, as_user: Sequence[str] = ()) -> Iterator[tuple[str, str]]:
    """`det-trials ui --port 0` in a process of its own (run through ``as_user``, e.g. a `setpriv` command line,
    when given); yields (base URL, token: "" with --no-token) and stops it afterwards. A browser opens
    `login_url(base, token)` first: the server answers it with the token's cookie."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*as_user, sys.executable, "-m", "determined_trials.cli.main", "ui", "--run-dir",
                             str(run_dir), "--port", "0", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while len(lines) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline().decode()
            if not line:
                break
            lines.append(line)
        text = "".join(lines)
        url = re.search(r"at (http://\S+?/)(?:\?token=(\S+))?\s", text)
        assert url and len(lines) == 2, \
            f"det-trials ui did not start: {text}{proc.stdout.read().decode() if proc.poll() is not None else ''}"
        yield url.group(1).rstrip("/"), url.group(2) or ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
