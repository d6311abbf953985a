"""Helpers for the experiment-runner tests: a context folder with the tiny trial script, running
`det-trials experiment create` in-process, and reading each trial's final model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import yaml

from determined_trials.cli.main import main
from determined_trials.core import LocalStore
from support.helpers_paths import SUPPORT

__all__ = ["DET_TRIALS", "SCRIPT", "create", "final_states", "kill_runner", "make_context", "start_runner", "when_stored"]

SCRIPT = SUPPORT / "trials_core_script.py"
DET_TRIALS = [sys.executable, "-m", "determined_trials.cli.main"]  # the CLI in a process of its own


def make_context(tmp_path: Path, hparams: dict[str, Any], **config: Any) -> tuple[Path, Path]:
    """A context folder with the tiny trial script and a config; returns (config path, context dir)."""
    ctx = tmp_path / "ctx"
    ctx.mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPT, ctx / "trial.py")
    full = {
        "name": "tiny", "entrypoint": "python3 trial.py",
        "hyperparameters": {"lr": 0.3, "target": 1.0, **hparams},
        "searcher": {"name": "single", "metric": "loss", "max_length": 6},
        "reproducibility": {"experiment_seed": 7}, "max_restarts": 2,
    }
    full.update(config)
    path = tmp_path / "const.yaml"
    path.write_text(yaml.safe_dump(full))
    return path, ctx


def create(run_dir: Path, config: Path, ctx: Path, *extra: str) -> int:
    return main(["--run-dir", str(run_dir), "experiment", "create", str(config), str(ctx), "--no-progress", *extra])


def final_states(store: LocalStore, experiment_id: int) -> dict[int, dict[str, Any]]:
    """Each trial's latest checkpoint content (its 'model')."""
    out = {}
    for trial in store.trials(experiment_id):
        latest = store.latest_checkpoint(trial.id)
        assert latest is not None
        out[trial.id] = json.loads((store.path / "checkpoints" / latest.uuid / "state.json").read_text())
    return out


def start_runner(run_dir: Path, config: Path, ctx: Path, out: Path,
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`det-trials experiment create` in a process (and session) of its own (``env``: its environment,
    default ours), its output in ``out``; returns once trial 1 wrote a checkpoint."""
    with open(out, "wb") as sink:
        proc = subprocess.Popen([*DET_TRIALS, "--run-dir", str(run_dir),
                                 "experiment", "create", str(config), str(ctx), "--no-progress"],
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    deadline = time.monotonic() + 120
    try:
        while not (run_dir / "store.sqlite").exists() or not LocalStore(run_dir).checkpoints():
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.05)
    except BaseException:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        raise
    return proc


def kill_runner(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 a runner started in a session of its own (it records nothing); its trials get SIGTERM and stop by
    themselves, which this waits for. Nothing to do when it has already ended."""
    if proc.poll() is not None:
        return
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.kill()
        proc.wait(timeout=60)
        _, alive = psutil.wait_procs(children, timeout=60)
        assert alive == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def when_stored(run_dir: Path, found: Callable[[LocalStore], Any], timeout: float = 300) -> Any:
    """Poll the run folder's store until ``found(store)`` gives something; that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "store.sqlite").exists():
            store = LocalStore(run_dir)
            try:
                result = found(store)
                if result:
                    return result
            except KeyError:
                pass
            finally:
                store.close()
        time.sleep(0.1)
    raise AssertionError(f"nothing found in {run_dir} within {timeout} s")
