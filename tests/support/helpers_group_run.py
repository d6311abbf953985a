"""``run_in_group``: ``subprocess.run`` for a command that starts processes of its own (a benchmark's
children, valgrind): it runs in a session of its own, and whatever of that group is left when the call
ends (the command's end, a timeout, the test's own timeout, an error) is killed, so nothing keeps burning
CPU after the test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from typing import IO, Any

__all__ = ["run_in_group"]


def run_in_group(cmd: Sequence[str], *, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` until it exits (at most ``timeout`` seconds: ``subprocess.TimeoutExpired``) with its
    output captured as text; what it started and left running is killed then."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True, **kwargs)
    assert proc.stdout is not None and proc.stderr is not None
    texts: dict[str, list[str]] = {"out": [], "err": []}
    readers = [threading.Thread(target=_read, args=(stream, texts[key]), daemon=True)
               for key, stream in (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()
    try:
        returncode = proc.wait(timeout=timeout)  # the command's end, not that of its pipes' last holder
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group outlives its leader while a member lives
        proc.wait()
        for reader in readers:
            reader.join(timeout=60)
    return subprocess.CompletedProcess(list(cmd), returncode, "".join(texts["out"]), "".join(texts["err"]))


def _read(stream: IO[str], into: list[str]) -> None:
    with stream:
        into.extend(iter(stream.readline, ""))
