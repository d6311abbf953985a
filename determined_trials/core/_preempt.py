"""PreemptContext: whether the task should stop now (SIGTERM/SIGUSR1 or a programmatic request).

Off-cluster the preemption signal is what Slurm and Kubernetes send before an eviction: SIGTERM, or
SIGUSR1 (Slurm's ``--signal``). In WorkersAskChief mode the chief's decision is broadcast, so every
rank sees the same answer at the same call; a worker that got the signal itself forwards it to the
chief, which acts on it at the next call.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from determined_trials.core._distributed import DistributedContext

__all__ = ["PREEMPT_SIGNALS", "PreemptContext", "PreemptMode"]

logger = logging.getLogger("determined_trials.core")

PREEMPT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)


class PreemptMode(enum.Enum):
    """Who may call ``should_preempt`` and how ranks agree (see the Core API reference)."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class PreemptContext:
    """Answers ``should_preempt()``; started and stopped by the Core ``Context``."""

    def __init__(
        self,
        dist: DistributedContext,
        mode: PreemptMode = PreemptMode.WorkersAskChief,
        *,
        signals: tuple[signal.Signals, ...] = PREEMPT_SIGNALS,
    ) -> None:
        if not isinstance(mode, PreemptMode):
            raise TypeError(f"preempt_mode must be a det.core.PreemptMode, got {mode!r}")
        self._dist = dist
        self._mode = mode
        self._signals = signals
        #: True once a preemption was requested: a plain flag (setting a bool is atomic, so signal
        #: handlers and other threads may set it), cheap enough for the training loop to read every batch
        self.signalled = False
        self._forwarded = False
        self._acknowledged = False
        self._started = False
        self._local_decision = False
        self._previous_handlers: dict[signal.Signals, Any] = {}
        self._first_signal_seen: dict[signal.Signals, bool] = {}

    @property
    def acknowledged(self) -> bool:
        """True once the preemption was acknowledged (the task expects to be resumed)."""
        return self._acknowledged

    def start(self) -> None:
        """Install the signal handlers (main thread only; elsewhere only programmatic requests work)."""
        if self._started:
            return
        self._started = True
        self._local_decision = self._dist.get_size() == 1 or self._mode is PreemptMode.WorkersAskMaster
        if threading.current_thread() is not threading.main_thread():
            logger.warning("core.init() ran outside the main thread: SIGTERM/SIGUSR1 will not preempt")
            return
        for sig in self._signals:
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def close(self) -> None:
        """Restore the signal handlers that were there before ``start``; idempotent."""
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()
        self._started = False
        self._local_decision = False

    @contextlib.contextmanager
    def stop_on_interrupt(self, message: str) -> Iterator[Callable[[], bool]]:
        """While inside: the first SIGINT (Ctrl-C) requests a preemption (the loop stops after the
        current batch, with a checkpoint) and prints ``message``; a second one raises
        ``KeyboardInterrupt`` at once. Yields a function telling whether a SIGINT arrived. Only in the
        main thread and only when SIGINT still has Python's default handler (a user's stays)."""
        seen: list[bool] = []
        install = (threading.current_thread() is threading.main_thread()
                   and signal.getsignal(signal.SIGINT) is signal.default_int_handler)

        def on_interrupt(signum: int, frame: FrameType | None) -> None:
            if seen:
                raise KeyboardInterrupt
            seen.append(True)
            print(message, file=sys.stderr, flush=True)
            self._request()

        if install:
            signal.signal(signal.SIGINT, on_interrupt)
        try:
            yield lambda: bool(seen)
        finally:
            if install:
                signal.signal(signal.SIGINT, signal.default_int_handler)

    def request_preemption(self) -> None:
        """Ask this task to stop as if it had received SIGTERM (thread-safe)."""
        self._request()

    @property
    def decides_locally(self) -> bool:
        """Whether ``check`` needs no collective (one process, or WorkersAskMaster), once started."""
        return self._local_decision

    def _request(self) -> None:
        self.signalled = True

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """True when the task should checkpoint and exit; cheap enough to call every batch."""
        preempt, _ = self.check(auto_ack=auto_ack)
        return preempt

    def check(self, stop_requested: bool = False, auto_ack: bool = True) -> tuple[bool, bool]:
        """(preempt, stop): the preemption decision and the chief's ``stop_requested``, agreed by all
        ranks in one collective (WorkersAskChief). The trial harness calls this once per batch."""
        if self._local_decision:  # one process (or WorkersAskMaster): no collective, just the flag
            preempt, stop = self.signalled, stop_requested
        elif not self._started:
            raise RuntimeError(
                "PreemptContext is not started: call should_preempt() inside `with det.core.init() as ctx:`"
            )
        else:
            preempt, stop = self._decide(stop_requested)
        if preempt and auto_ack and not self._acknowledged:
            self.acknowledge_preemption_signal()
        return preempt, stop

    def acknowledge_preemption_signal(self) -> None:
        """Record that the task stops because of preemption and expects to be resumed later."""
        self._acknowledged = True

    def _decide(self, stop_requested: bool) -> tuple[bool, bool]:
        size = self._dist.get_size()
        if size == 1 or self._mode is PreemptMode.WorkersAskMaster:
            return self.signalled, stop_requested
        is_chief = self._dist.get_rank() == 0
        if self._mode is PreemptMode.ChiefOnly:
            if not is_chief:
                raise RuntimeError(
                    "PreemptMode.ChiefOnly: only the chief (rank 0) may call should_preempt(); "
                    "use PreemptMode.WorkersAskChief to have every rank ask in step"
                )
            return self.signalled or self._dist._chief_poll_worker_signals(), stop_requested
        if is_chief:
            preempt = self.signalled or self._dist._chief_poll_worker_signals()
            decision = self._dist.broadcast((preempt, stop_requested))
        else:
            if self.signalled and not self._forwarded:
                self._forwarded = True
                self._dist._worker_send_signal()
            decision = self._dist.broadcast(None)
        return bool(decision[0]), bool(decision[1])

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self._first_signal_seen.get(sig):
            self._exit_as_before(sig, frame)
            return
        self._first_signal_seen[sig] = True
        logger.info("received %s: the task will checkpoint and stop at the next preemption check", sig.name)
        self._request()

    def _exit_as_before(self, sig: signal.Signals, frame: FrameType | None) -> None:
        """A second identical signal behaves as it would have without us (usually: the process ends)."""
        previous = self._previous_handlers.get(sig, signal.SIG_DFL)
        if callable(previous):
            previous(sig, frame)
            return
        if previous == signal.SIG_IGN:
            return
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
