"""``TrialTimer``: the loop's share of where a trial's wall time goes (start, build, train, data_wait, validation,
checkpoint, restore, replay), measured at the loop's boundaries (never per batch) and added to the store's by
the chief's ``TrainContext`` (``core.store.TIME_PARTS``; the runner adds ``queued`` and the wall)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from determined_trials.core.store import SPAWNED_AT_ENV

if TYPE_CHECKING:
    from determined_trials.core import Context

__all__ = ["TrialTimer"]

_started_processes: set[int] = set()  # processes whose ``start`` part was added (one per process)


class TrialTimer:
    """Adds the loop's time parts of one ``Controller.run`` (chief only; other ranks measure nothing)."""

    def __init__(self, core: Context, *, chief: bool) -> None:
        self._train = core.train if chief else None
        self._opened_at = core.opened_at
        self._restore_s = 0.0
        self._reached_before = 0  # batches an earlier attempt trained: training them again is replay

    @contextlib.contextmanager
    def held(self, part: str) -> Iterator[None]:
        """Add the time the block takes to ``part``."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(part, time.perf_counter() - began)

    def add(self, part: str, seconds: float) -> None:
        """Add ``seconds`` to ``part``."""
        if self._train is not None:
            self._train.add_time(part, seconds)

    @contextlib.contextmanager
    def restoring(self) -> Iterator[None]:
        """The block restores a checkpoint: its time is ``restore`` (and not ``build``)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - began
            self._restore_s += took
            self.add("restore", took)

    def training_starts(self) -> None:
        """The first workload is next: ``start`` (process start to ``init()``, once a process, when the runner
        started it) and ``build`` (``init()`` to now: the trial's ``__init__``, its data loaders; not restore)."""
        if self._train is None:
            return
        now = time.time()
        self._reached_before = self._train.batches_reached()
        spawned = os.environ.get(SPAWNED_AT_ENV)
        if spawned and os.getpid() not in _started_processes:
            _started_processes.add(os.getpid())
            self.add("start", max(0.0, self._opened_at - float(spawned)))
        self.add("build", max(0.0, now - self._opened_at - self._restore_s))

    def trained(self, seconds: float, first: int, end: int, data_wait: float) -> None:
        """Batches ``first`` to ``end`` (exclusive) took ``seconds`` (``data_wait`` of them waiting for data): the
        share of batches an earlier attempt trained is ``replay``, the rest ``train`` and ``data_wait``."""
        if self._train is None:
            return
        count = end - first
        replayed = min(end, self._reached_before) - first
        share = replayed / count if count > 0 and replayed > 0 else 0.0
        self.add("replay", seconds * share)
        self.add("data_wait", data_wait * (1.0 - share))
        self.add("train", (seconds - data_wait) * (1.0 - share))
        self._train.set_batches_reached(end)
