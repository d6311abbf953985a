"""Helpers for the dashboard tests: a store written directly with the store API, and `det-trials ui` as a real
server on a free loopback port (stopped by the caller)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from determined_trials.core import LocalStore

__all__ = ["EVIL", "make_store", "running_ui"]

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


@contextmanager
def running_ui(run_dir: Path, *extra: str) -> Iterator[tuple[str, str]]:
    """`det-trials ui --port 0` in a process of its own; yields (base URL, token) and stops it afterwards."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "determined_trials.cli.main", "ui", "--run-dir", str(run_dir),
                             "--port", "0", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
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
        url = re.search(r"at (http://\S+?/)(\?token=\S+)?\s", text)
        token = re.search(r"token (\S+) \(kept", text)
        assert url and token, f"det-trials ui did not start: {text}{proc.stdout.read().decode() if proc.poll() else ''}"
        yield url.group(1).rstrip("/"), token.group(1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
