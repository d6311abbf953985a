"""One trial process: started in a session of its own, its output prefixed with ``[trial N] `` on the
terminal (less the launcher's failed-rank line, which the runner's own failure lines replace) and kept
in the trial's log file, stopped by SIGTERM to its process group."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from determined_trials.launch import FAILED_RANK_LINE, die_with_parent

__all__ = ["TrialProcess"]

_TAIL_LINES = 20
_RANK_PREFIX = re.compile(r"^\[rank=\d+\] ")
_OUTPUT_ABOVE = re.compile(r" \(its output is above, prefixed \[rank=\d+\]\)$")  # the launcher's, for a terminal
_STRAY_GRACE_S = 5.0  # after the process ended, how long what is left of its group may hold the output
_STRAY_GRACE_TERMINATED_S = 60.0  # ... when it was asked to stop (a child may still be checkpointing)
_KILL_GRACE_S = 10.0  # after kill(): how long a launcher gets to kill its workers and remove its launch folder


class TrialProcess:
    """A running trial process; ``poll()`` gives its exit status once its output is drained."""

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        prefix: str,
        echo: Callable[[str], None],
        child: Any = None,
        on_output_end: Callable[[], None] = lambda: None,
    ) -> None:
        self.cmd = list(cmd)
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.terminated = False
        self._echo = echo
        self._prefix = prefix
        self._on_output_end = on_output_end  # the process ended (or closed its output): poll may have news
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self._log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed by the reader thread
        # `child`: a process already started (forked warm, ``_warm``) with Popen's pid, stdout, poll and wait
        self._proc = child or subprocess.Popen(
            self.cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGTERM),  # the runner killed: checkpoint and stop, no orphan
        )
        assert self._proc.stdout is not None
        self._reader = threading.Thread(target=self._pump, args=(self._proc.stdout,), daemon=True)
        self._reader.start()
        self._ended_at: float | None = None
        self._kill_deadline: float | None = None

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        return self._proc.pid

    def _pump(self, stream: IO[bytes]) -> None:
        try:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                self.tail.append(line)
                self._log.write(line + "\n")
                self._log.flush()
                if not FAILED_RANK_LINE.match(line):  # it repeats the traceback's last line: once is enough
                    self._echo(self._prefix + line)
        finally:
            stream.close()
            self._log.close()
            self._on_output_end()

    def poll(self) -> int | None:
        """The exit status once the process ended and its output was read, else None."""
        code = self._proc.poll()
        if code is None:
            if self._kill_deadline is not None and time.monotonic() > self._kill_deadline:
                self._signal_group(signal.SIGKILL)
            return None
        if self._reader.is_alive():
            self._ended_at = self._ended_at or time.monotonic()
            grace = _STRAY_GRACE_TERMINATED_S if self.terminated else _STRAY_GRACE_S
            if time.monotonic() - self._ended_at > grace:
                self._signal_group(signal.SIGKILL)  # children left behind that hold the output: end them
            return None
        self._signal_group(signal.SIGKILL)  # nothing of the group may outlive the trial
        return code

    def wait(self, timeout: float | None = None) -> int:
        """Block until the process ended and its output was read; returns the exit status. After
        ``kill()``, what is still running at the end of its grace period gets SIGKILL."""
        if self._kill_deadline is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(max(0.0, self._kill_deadline - time.monotonic()))
            self._signal_group(signal.SIGKILL)
        code = self._proc.wait(timeout)
        self._reader.join(timeout)
        return code

    def terminate(self) -> None:
        """SIGTERM to the process group, once: the trial checkpoints and exits (status 75 or 0)."""
        if self.terminated:
            return
        self.terminated = True
        self._signal_group(signal.SIGTERM)

    def kill(self) -> None:
        """Stop the trial now, once: a second stop signal (SIGINT after the SIGTERM of ``terminate``), on
        which a launcher kills its workers and removes its launch folder; whatever still runs
        ``_KILL_GRACE_S`` later gets SIGKILL (from ``poll`` or ``wait``). It resumes later from its
        latest checkpoint."""
        if self._kill_deadline is not None:
            return
        self._kill_deadline = time.monotonic() + _KILL_GRACE_S
        self.terminate()
        self._signal_group(signal.SIGINT)

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def reason(self, code: int) -> str:
        """A one-line failure reason: the exit status and the last line of output (the traceback was
        shown as it came, and stays in the trial's log)."""
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        lines = [_RANK_PREFIX.sub("", line).strip() for line in self.tail if line.strip()]
        last = _OUTPUT_ABOVE.sub("", lines[-1]) if lines else "(no output)"  # the log path below says where it is
        return f"trial process failed ({how}): {last} (whole output: {self.log_path})"
