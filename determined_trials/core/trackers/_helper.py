"""The trial's side of its tracker helper: the process (``python -m determined_trials.core.trackers``) that runs the
tracker clients off the training process, fed from the store, and the trial's thread that stores held reports.

The trial sends the helper one line of facts on its stdin, waits for its ``ready`` line (the clients are built: what
the trial used to do itself before its first batch), and at its end one line with its outcome; the helper then sends
what the store holds and ends each run. If the trial dies first (a kill -9), the helper sees its stdin close and does
the same with ``Outcome.KILLED``: nothing the store holds is lost.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from determined_trials.config import ExperimentConfig
from determined_trials.core.trackers._forwarder import FINISH_TIMEOUT_ENV
from determined_trials.core.trackers._sink import Outcome, TrialFacts

__all__ = ["READY", "TrackerHelper", "facts_line", "start_tracker_helper"]

logger = logging.getLogger("determined_trials.trackers")

READY = "ready"
_FLUSH_EVERY_S = 1.0  # the report buffer holds a report at most a second (core.store HOLD_S)
_READY_TIMEOUT_S = 300.0  # the helper imports the tracker clients (seconds on a loaded machine)


def facts_line(facts: TrialFacts, config: ExperimentConfig) -> str:
    """What the helper needs to know of the trial, as one line of JSON."""
    return json.dumps({"facts": dataclasses.asdict(facts), "config": config.as_dict()}) + "\n"


class TrackerHelper:
    """The running helper of one trial, and the thread that stores the reports the trial holds (``flush_due``,
    every second) so that a report followed by none for a while reaches the store, and so the tracker."""

    def __init__(self, proc: subprocess.Popen[str], flush_due: Callable[[], None] | None) -> None:
        self._proc = proc
        self._flush_due = flush_due
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name="det-report-flush", daemon=True)
        if flush_due is not None:
            self._flusher.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _flush_loop(self) -> None:
        assert self._flush_due is not None
        while not self._stop.wait(_FLUSH_EVERY_S):
            try:
                self._flush_due()
            except Exception as exc:  # the trial's own store call reports the problem; keep going
                logger.debug("trackers: storing the held reports failed: %s", exc)

    def finish(self, outcome: Outcome, timeout_s: float | None = None) -> None:
        """Tell the helper how the trial ended (the trial stored its last reports) and wait at most ``timeout_s``
        (+5 s) for it to send them and end each run."""
        if timeout_s is None:
            timeout_s = float(os.environ.get(FINISH_TIMEOUT_ENV, "30"))
        self._stop.set()
        if self._flusher.is_alive():
            self._flusher.join()
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(outcome.name + "\n")
            self._proc.stdin.close()
        except OSError:  # it ended already (its own error is in the output)
            pass
        try:
            self._proc.wait(timeout_s + 5.0)
        except subprocess.TimeoutExpired:
            logger.warning("trackers: the helper of pid %d is still sending after %.0f s; it goes on in the "
                           "background (at most its own deadline), what it does not send stays in the store "
                           "and the trial's next attempt sends it", self._proc.pid, timeout_s)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def start_tracker_helper(facts: TrialFacts, config: ExperimentConfig,
                         flush_due: Callable[[], None] | None = None) -> TrackerHelper:
    """Start the trial's tracker helper and wait until its clients are built (an error raises here, before the
    first batch, as a client built in the trial did)."""
    package_root = str(Path(__file__).resolve().parents[3])  # the folder that holds determined_trials
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(  # a session of its own: a signal to the trial's group (Ctrl-C, a runner's or a
        [sys.executable, "-m", "determined_trials.core.trackers", str(os.getpid())],  # launcher's kill) leaves it
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1,  # to send what is stored
        start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(facts_line(facts, config))
    proc.stdin.flush()
    if _read_line(proc.stdout, _READY_TIMEOUT_S) != READY:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the tracker helper of trial {facts.trial.trial_id} did not start (exit code "
                           f"{proc.returncode}; its error is above)")
    return TrackerHelper(proc, flush_due)


def _read_line(stream: IO[Any], timeout_s: float) -> str | None:
    """The next line of ``stream`` without its newline; None at its end or after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        readable, _, _ = select.select([stream], [], [], max(0.0, min(1.0, end - time.monotonic())))
        if readable:
            line = stream.readline()
            return line.rstrip("\n") if line else None
    return None
