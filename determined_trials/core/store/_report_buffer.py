"""What a TrainContext stores a little later instead of committing at every call: training reports
less than a second apart (stored together, in one transaction) and the display-only progress and
status (the latest value, at most once a second, and with every store of reports), and the trial's time parts
(added up, stored with every store of reports and at close)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from determined_trials.core.store._trial_store import TrialStore

__all__ = ["HOLD_S", "DisplayFields", "HeldTime", "ReportBuffer"]

HOLD_S = 1.0  # the longest a report or display value waits before it is stored (at the next call)


class ReportBuffer:
    """Metrics reports of one trial: held while they come less than ``HOLD_S`` apart, then stored in
    one transaction. ``flush`` (any thread) stores what is held, then calls ``after_store``;
    ``add(now=True)`` stores at once."""

    def __init__(self, store: TrialStore, trial_id: int, after_store: Callable[[], None] | None = None) -> None:
        self._store, self._trial_id = store, trial_id
        self._after_store = after_store
        self._held: list[dict[str, Any]] = []
        self._stored_at = -math.inf
        self._lock = threading.Lock()  # the checkpoint writer thread flushes before recording

    def add(self, report: dict[str, Any], *, now: bool = False) -> None:
        """Hold ``report`` (``TrialStore.add_metrics_reports`` fields); store everything held when
        ``now`` or when the last store was ``HOLD_S`` ago."""
        with self._lock:
            self._held.append(report)
        if now or time.monotonic() - self._stored_at >= HOLD_S:
            self.flush()

    def flush_due(self) -> None:
        """Store the held reports if the last store was ``HOLD_S`` ago (any thread: a tracker's forwarder calls it,
        so a report followed by none for a while is stored all the same)."""
        if self._held and time.monotonic() - self._stored_at >= HOLD_S:
            self.flush()

    def flush(self) -> None:
        """Store the held reports (in the order they were reported); nothing to do when none is held."""
        with self._lock:
            held, self._held = self._held, []
            if held:
                self._store.add_metrics_reports(trial_id=self._trial_id, reports=held)
            self._stored_at = time.monotonic()
        if held and self._after_store is not None:
            self._after_store()


class DisplayFields:
    """The trial's progress and status: the latest value is stored when ``HOLD_S`` passed since the
    last write (checked at every call and report), when asked (``now``; ``write`` from any thread, e.g.
    right after the reports are stored, so the progress a page shows goes with the batches it shows), and at
    close."""

    def __init__(self, store: TrialStore, trial_id: int) -> None:
        self._store, self._trial_id = store, trial_id
        self._pending: dict[str, Any] = {}
        self._written_at = -math.inf
        self._lock = threading.Lock()

    def set(self, field: str, value: Any, *, now: bool = False) -> None:
        """Hold ``value`` for ``field`` ("progress" or "status")."""
        with self._lock:
            self._pending[field] = value
        if now:
            self.write()
        else:
            self.write_if_due()

    def write_if_due(self) -> None:
        """Write the held values if the last write was ``HOLD_S`` ago."""
        if self._pending and time.monotonic() - self._written_at >= HOLD_S:
            self.write()

    def write(self) -> None:
        """Write the held values now."""
        with self._lock:  # held while writing: an older value never lands after a newer one
            pending, self._pending = self._pending, {}
            if "progress" in pending:
                self._store.set_trial_progress(self._trial_id, pending["progress"])
            if "status" in pending:
                self._store.set_trial_status(self._trial_id, pending["status"])
            self._written_at = time.monotonic()


class HeldTime:
    """Seconds of a trial's time parts (``TIME_PARTS``) and the most batches it reached, added up in memory and
    stored (added to the store's) by ``write``: with every store of reports and at close, never per batch."""

    def __init__(self, store: TrialStore, trial_id: int) -> None:
        self._store, self._trial_id = store, trial_id
        self._parts: dict[str, float] = {}
        self._reached: int | None = None
        self._lock = threading.Lock()

    def add(self, part: str, seconds: float) -> None:
        """Add ``seconds`` to ``part``."""
        with self._lock:
            self._parts[part] = self._parts.get(part, 0.0) + seconds

    def reached(self, batches: int) -> None:
        """The trial has trained ``batches`` batches."""
        self._reached = batches

    def write(self) -> None:
        """Store what was added since the last write."""
        with self._lock:
            parts, self._parts = self._parts, {}
            reached, self._reached = self._reached, None
            if parts or reached is not None:
                self._store.add_trial_time(self._trial_id, parts, reached)
