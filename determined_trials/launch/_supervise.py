"""Supervise a launch command (torchrun, or one wrapped rank) through the launch folder: preempt every
worker on SIGTERM/SIGINT, stop the job soon after a worker fails, leave no process behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

import psutil

from determined_trials.launch._launch_dir import (
    PREEMPTED_EXIT_CODE,
    RankResult,
    is_ready,
    read_failure_times,
    read_pids,
    read_results,
    was_preempted,
)
from determined_trials.launch._lines import failure_reason
from determined_trials.launch._procs import (
    child_pids,
    descendants,
    die_with_parent,
    exit_code,
    kill_descendants,
    set_subreaper,
)

__all__ = ["FAILED_RANK_LINE", "Supervisor"]

FAILED_RANK_LINE = re.compile(
    r"^\w+: rank \d+ failed with exit code -?\d+.*\(its output is above, prefixed \[rank=\d+\]\)$")
"""The launcher's one-line verdict on a failed rank (``_report_failure``): it repeats the last line of the
rank's output, so a runner that summarises failures itself need not show it again."""

_POLL_S = 0.05
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Supervisor:
    """Runs ``cmd`` in a session of its own and returns the job's exit status from ``run()``.

    ``wait_ready``: hold a worker's preemption signal back until it said it handles one (the
    harness does; a custom script is signalled at once). ``fail_grace``: seconds the other workers
    get to stop by themselves after one failed, before everything is killed. ``signals``: the list the
    launcher recorded stop signals in until now (this one appends to it too).
    """

    def __init__(
        self, cmd: Sequence[str], env: dict[str, str], folder: Path, *,
        name: str, wait_ready: bool, fail_grace: float, signals: list[int] | None = None,
    ) -> None:
        self._cmd = list(cmd)
        self._env = env
        self._folder = folder
        self._name = name
        self._wait_ready = wait_ready
        self._fail_grace = fail_grace
        self._signals: list[int] = signals if signals is not None else []  # the launcher's: none is lost
        self._signalled: set[int] = set()
        self._failed_at: float | None = None
        self._killed = False
        self._foreign: set[int] = set()  # children this process had before: never ours to kill

    def run(self) -> int:
        self._foreign = child_pids()
        set_subreaper()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _STOP_SIGNALS}
        try:
            proc = subprocess.Popen(self._cmd, env=self._env, start_new_session=True, stderr=subprocess.PIPE,
                                    preexec_fn=die_with_parent(signal.SIGTERM))
            assert proc.stderr is not None
            pump = threading.Thread(target=_pass_stderr, args=(proc.stderr,), daemon=True)
            pump.start()
            try:
                returncode = self._watch(proc)
            finally:
                self._cleanup(proc)
                pump.join(timeout=10)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._outcome(returncode)

    # -- watching -------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    def _watch(self, proc: subprocess.Popen[Any]) -> int:
        announced = False
        while True:
            returncode = proc.poll()
            if returncode is not None:
                return returncode
            if len(self._signals) >= 2 and not self._killed:
                self._say(f"{signal.Signals(self._signals[1]).name} again: killing every worker")
                self._kill_all()
            elif self._signals and not self._killed:
                if not announced:
                    announced = True
                    self._say(f"received {signal.Signals(self._signals[0]).name}: asking every worker to "
                              "checkpoint and stop (send it again to kill them)")
                self._preempt_workers()
            self._check_failures()
            time.sleep(_POLL_S)

    def _preempt_workers(self) -> None:
        """SIGTERM, once, to each worker that can take it (pids from the launch folder)."""
        pids = {p for p in read_pids(self._folder).values() if p not in self._signalled}
        if not pids:
            return
        ours = {p.pid for p in descendants(self._foreign)}
        for pid in pids:
            if pid not in ours:  # ended already: nothing to preempt
                self._signalled.add(pid)
            elif not self._wait_ready or is_ready(self._folder, pid):
                self._signalled.add(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)

    def _check_failures(self) -> None:
        if self._killed:
            return
        if self._failed_at is None:
            if any(r.exit_code != 0 for r in read_results(self._folder).values()):
                self._failed_at = time.monotonic()
        elif time.monotonic() - self._failed_at > self._fail_grace:
            self._say(f"a worker failed and the others did not stop within {self._fail_grace:g} s: killing them")
            self._kill_all()

    def _kill_all(self) -> None:
        self._killed = True
        kill_descendants(signal.SIGKILL, self._foreign)

    def _cleanup(self, proc: subprocess.Popen[Any]) -> None:
        """Kill whatever is left (the command's stray children too) and collect their exit status."""
        if proc.poll() is None:
            kill_descendants(signal.SIGKILL, self._foreign)
            proc.wait()
        left = kill_descendants(signal.SIGKILL, self._foreign)
        psutil.wait_procs(left, timeout=5)

    # -- the verdict ----------------------------------------------------------------------------

    def _outcome(self, returncode: int) -> int:
        results = read_results(self._folder)
        failed_at = read_failure_times(self._folder)  # when the error happened, where the rank recorded it
        failures = sorted((r for r in results.values() if r.exit_code != 0),
                          key=lambda r: failed_at.get(r.rank, r.ended_at))
        if len(self._signals) >= 2:
            return 128 + self._signals[1]
        if failures:
            self._report_failure(failures[0], len(failures))
            return failures[0].exit_code
        if returncode != 0:
            self._say(f"the launch command {self._cmd[0]} {self._cmd[1:3]} failed with exit code "
                      f"{exit_code(returncode)} before any worker reported a failure")
            return exit_code(returncode) or 1
        if was_preempted(self._folder):
            self._say(f"preempted, resumable: every worker stopped after a checkpoint (exit {PREEMPTED_EXIT_CODE})")
            return PREEMPTED_EXIT_CODE
        return 0

    def _report_failure(self, first: RankResult, count: int) -> None:
        others = f" ({count - 1} more rank(s) failed after it)" if count > 1 else ""
        # Its output (the traceback) is above, prefixed [rank=N]: name only the line that says why.
        self._say(f"rank {first.rank} failed with exit code {first.exit_code}{others}: "
                  f"{failure_reason(first.last_lines)} "
                  f"(its output is above, prefixed [rank={first.rank}])")

    def _say(self, message: str) -> None:
        print(f"{self._name}: {message}", file=sys.stderr, flush=True)


_ELASTIC_LOG = re.compile(r"^[EWI]\d{4} .*torch/distributed/elastic/")


def _pass_stderr(stream: IO[bytes]) -> None:
    """Copy the command's stderr through, except torchrun's own report of a failed worker (its
    ChildFailedError traceback and elastic log lines): we name the failing rank ourselves, and the
    worker's traceback is already there, prefixed ``[rank=N]``."""
    in_traceback = False
    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    try:
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", errors="replace")
            if not text.startswith("[rank="):
                in_traceback = in_traceback or text.startswith("Traceback (most recent call last)")
                if in_traceback or _ELASTIC_LOG.match(text):
                    continue
            if out is not None:
                out.write(raw)
                out.flush()
            else:
                sys.stderr.write(text)
                sys.stderr.flush()
    except (OSError, ValueError):
        pass  # our stderr closed: nothing left to show
    finally:
        stream.close()
