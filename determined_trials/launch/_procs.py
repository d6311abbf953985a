"""Process plumbing for the launchers: exit codes, free ports, tying a child's life to its parent,
finding and killing everything a launcher started, and stop signals before the supervisor runs."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from types import FrameType

import psutil

__all__ = [
    "StopRequested", "child_pids", "descendants", "die_with_parent", "exit_code", "free_port", "kill_descendants",
    "record_stop_signals", "run_child", "set_subreaper",
]

_CHILD_POLL_S = 0.1  # how often run_child looks at the stop signals while its child runs

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc: ctypes.CDLL | None = None


def _prctl() -> Callable[..., int] | None:
    """libc's prctl on Linux (loaded before any fork: a preexec_fn must not load libraries)."""
    global _libc
    if not sys.platform.startswith("linux"):
        return None
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl: Callable[..., int] = _libc.prctl
    return prctl


def exit_code(returncode: int) -> int:
    """A shell-style exit status: a child killed by signal n gives 128 + n."""
    return 128 - returncode if returncode < 0 else returncode


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def set_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux), so that none escapes ``kill_descendants``."""
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def die_with_parent(sig: int, *, new_group: bool = False) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``sig`` when its parent dies (Linux) and, with ``new_group``,
    runs in a process group of its own."""
    prctl = _prctl()
    parent = os.getpid()

    def preexec() -> None:
        if new_group:
            os.setpgid(0, 0)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the call above
                os._exit(128 + int(sig))

    return preexec


def child_pids() -> set[int]:
    """The pids of this process's children right now."""
    try:
        return {p.pid for p in psutil.Process().children()}
    except psutil.Error:
        return set()


def descendants(exclude: AbstractSet[int] = frozenset()) -> list[psutil.Process]:
    """This process's descendants, leaving out the children in ``exclude`` and everything below them."""
    found: list[psutil.Process] = []
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return found
    for child in children:
        if child.pid in exclude:
            continue
        found.append(child)
        with contextlib.suppress(psutil.Error):
            found.extend(child.children(recursive=True))
    return found


def kill_descendants(sig: int = signal.SIGKILL, exclude: AbstractSet[int] = frozenset()) -> list[psutil.Process]:
    """Send ``sig`` to the live ``descendants(exclude)``; returns them (``psutil.wait_procs`` reaps them)."""
    procs = descendants(exclude)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
    return procs


class StopRequested(Exception):
    """A stop signal (SIGTERM, SIGINT) arrived while the launcher was still preparing its workers."""


@contextlib.contextmanager
def record_stop_signals() -> Iterator[list[int]]:
    """SIGTERM and SIGINT are recorded in the yielded list while the block runs (main thread), instead of
    killing the launcher before its supervisor handles them."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def record(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_child(cmd: Sequence[str], *, timeout: float, stop: Sequence[int]) -> str:
    """Run ``cmd`` (a short helper process) and return its stdout; it dies with this process, and is
    killed when ``stop`` (a ``record_stop_signals`` list) gets a signal (``StopRequested``) or after
    ``timeout`` seconds (``subprocess.TimeoutExpired``)."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent(signal.SIGKILL))
    deadline = time.monotonic() + timeout
    try:
        while True:
            if stop:
                raise StopRequested(signal.Signals(stop[0]).name)
            try:
                out, _ = proc.communicate(timeout=min(_CHILD_POLL_S, max(deadline - time.monotonic(), 0.0)))
                return out
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
