"""Helpers shared by the checkpoint tests: a recording CheckpointRecorder, file trees, worker environment."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from determined_trials.core import CheckpointRecorder
from support.helpers_paths import REPO, SUPPORT

__all__ = ["REPO", "WORKER", "Recorder", "failure", "make_tree", "read_tree", "start_worker", "worker_env"]

WORKER = SUPPORT / "worker_ckpt_kill.py"


def worker_env() -> dict[str, str]:
    """The environment for a worker subprocess: the repository importable even without an install."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


class Recorder(CheckpointRecorder):
    """Collects what CheckpointContext reports."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, dict[str, Any], dict[str, int]]] = []
        self.deleted: list[str] = []

    def checkpoint_saved(self, storage_id: str, metadata: dict[str, Any], resources: dict[str, int]) -> None:
        self.saved.append((storage_id, metadata, resources))

    def checkpoint_deleted(self, storage_id: str) -> None:
        self.deleted.append(storage_id)


def make_tree(root: Path) -> dict[str, bytes]:
    files = {"model.bin": os.urandom(5000), "sub/opt.bin": b"optimizer", "sub/deep/x.txt": b"x"}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def failure(fn: Callable[[], Any]) -> tuple[str, str]:
    """Run ``fn`` (in a rank) and return (exception type name, message), or ("ok", "") if it returned."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - reported back to the test process
        return type(exc).__name__, str(exc)
    return "ok", ""


@contextmanager
def start_worker(*args: str, timeout: float = 30.0) -> Iterator[tuple[subprocess.Popen[str], Callable[[], str]]]:
    """Start the kill worker; yield it and a ``next_line()`` that waits at most ``timeout`` s per line.

    The worker is killed and reaped on exit, whatever happened.
    """
    proc = subprocess.Popen([sys.executable, str(WORKER), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=worker_env())
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    out = proc.stdout

    def pump() -> None:
        for line in iter(out.readline, ""):
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()

    def next_line() -> str:
        try:
            return lines.get(timeout=timeout).strip()
        except queue.Empty:
            proc.kill()
            _, err = proc.communicate(timeout=timeout)
            raise AssertionError(f"the worker printed nothing for {timeout} s; stderr:\n{err}") from None

    try:
        yield proc, next_line
    finally:
        proc.kill()
        proc.communicate(timeout=timeout)
