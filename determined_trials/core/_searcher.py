"""SearcherContext: the searcher's operations (train to an absolute length, then report the metric).

Operations come from an ``OperationSource``: for a bare script or the ``single`` searcher one
operation of ``searcher.max_length``; the local experiment runner supplies richer sources (ASHA
rungs). In WorkersAskChief mode the chief's operations are broadcast so every rank sees the same.
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from determined_trials.core._progress import trial_progress

if TYPE_CHECKING:
    from determined_trials.core._distributed import DistributedContext

__all__ = [
    "OperationSource",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "SingleOperationSource",
    "Unit",
]


class Unit(enum.Enum):
    """The unit ``searcher.max_length`` was configured in."""

    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"

    @classmethod
    def from_name(cls, name: str | None) -> Unit | None:
        """'batches' / 'records' / 'epochs' (any case) to a Unit; None stays None."""
        return None if name is None else cls(name.upper())


class SearcherMode(enum.Enum):
    """WorkersAskChief: every rank iterates in step. ChiefOnly: only the chief iterates."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"


class OperationSource(Protocol):
    """Where operation lengths come from; told each completed metric before asked for the next."""

    def next_length(self) -> int | None:
        """The next absolute length to train to, or None when the searcher has no more work."""

    def completed(self, length: int, metric: float) -> None:
        """The operation of ``length`` finished with ``metric``."""


class SingleOperationSource:
    """Fixed operations: one of ``searcher.max_length`` (bare scripts), or the lengths a local
    experiment runner hands a trial process (it restarts the process for later operations)."""

    def __init__(self, *lengths: int) -> None:
        self._lengths = list(lengths)

    def next_length(self) -> int | None:
        return self._lengths.pop(0) if self._lengths else None

    def completed(self, length: int, metric: float) -> None:
        pass


class _Recorder(Protocol):
    def record_searcher_op(self, trial_id: int, length: int, metric: float | None, completed: bool) -> None: ...
    def set_trial_progress(self, trial_id: int, progress: float) -> None: ...


def _nothing() -> None:
    """The default ``before_record``: nothing is held back to store first."""


class SearcherOperation:
    """Train until ``length`` (absolute, in the configured units), then ``report_completed(metric)``."""

    def __init__(self, *, length: int, is_chief: bool, trial_id: int, store: _Recorder, max_length: int,
                 before_record: Callable[[], None] = _nothing) -> None:
        self.length = length
        self._is_chief = is_chief
        self._trial_id = trial_id
        self._store = store
        self._before_record = before_record  # reports made before the completion are stored before it
        self._max_length = max(max_length, 1)
        self._completed = False
        self.metric: float | None = None

    @property
    def max_length(self) -> int:
        """The most the trial trains (``searcher.max_length``, or its longest operation), in ``length``'s units:
        its progress is the length trained over this."""
        return self._max_length

    @property
    def completed(self) -> bool:
        """True once ``report_completed`` was called."""
        return self._completed

    def report_progress(self, length: float) -> None:
        """Say how far training has got, in the same units as ``length``."""
        self._require_chief("report_progress")
        if not isinstance(length, numbers.Real) or length < 0:
            raise ValueError(f"report_progress takes a non-negative length, got {length!r}")
        self._store.set_trial_progress(self._trial_id, trial_progress(float(length), self._max_length))

    def report_completed(self, searcher_metric: Any) -> None:
        """Report the searcher metric for this operation; exactly once, on the chief."""
        self._require_chief("report_completed")
        if self._completed:
            raise RuntimeError(f"report_completed() was already called for the operation of length {self.length}")
        metric = _as_metric(searcher_metric)
        self._completed = True
        self.metric = metric
        self._before_record()
        self._store.record_searcher_op(self._trial_id, self.length, metric, True)

    def _require_chief(self, what: str) -> None:
        if not self._is_chief:
            raise RuntimeError(f"only the chief (rank 0) may call SearcherOperation.{what}()")


class SearcherContext:
    """Iterates the searcher's operations for this trial."""

    def __init__(
        self,
        dist: DistributedContext,
        *,
        source: OperationSource,
        trial_id: int,
        store: _Recorder,
        units: Unit | None = None,
        max_length: int = 1,
        before_record: Callable[[], None] = _nothing,
    ) -> None:
        self._dist = dist
        self._source = source
        self._trial_id = trial_id
        self._store = store
        self._units = units
        self._max_length = max_length
        self._before_record = before_record
        self._out_of_ops_acknowledged = False

    def get_configured_units(self) -> Unit | None:
        """The unit of ``searcher.max_length`` in the config, or None when it was a bare number."""
        return self._units

    def operations(
        self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief, auto_ack: bool = True
    ) -> Iterator[SearcherOperation]:
        """Yield operations until the searcher has none left."""
        is_chief = self._dist.get_rank() == 0
        if searcher_mode is SearcherMode.ChiefOnly and not is_chief:
            raise RuntimeError(
                "SearcherMode.ChiefOnly: only the chief may call operations(); "
                "use SearcherMode.WorkersAskChief to iterate on every rank"
            )
        broadcast = searcher_mode is SearcherMode.WorkersAskChief and self._dist.get_size() > 1
        while True:
            length = self._source.next_length() if is_chief else None
            if broadcast:
                length = self._dist.broadcast(length)
            if length is None:
                break
            op = SearcherOperation(
                length=length, is_chief=is_chief, trial_id=self._trial_id,
                store=self._store, max_length=self._max_length, before_record=self._before_record,
            )
            yield op
            if is_chief:
                self._finish(op)
        if auto_ack:
            self.acknowledge_out_of_ops()

    def acknowledge_out_of_ops(self) -> None:
        """Say the trial stops because the searcher has no more operations for it."""
        self._out_of_ops_acknowledged = True

    def _finish(self, op: SearcherOperation) -> None:
        if not op.completed:
            raise RuntimeError(
                f"the operation of length {op.length} ended without op.report_completed(metric); "
                "the chief must report the searcher metric for every operation before asking for the next"
            )
        assert op.metric is not None
        self._source.completed(op.length, op.metric)


def _as_metric(value: Any) -> float:
    if hasattr(value, "item") and not isinstance(value, numbers.Real):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"the searcher metric must be a number, got {value!r} ({type(value).__name__})")
    if math.isnan(float(value)):
        raise ValueError("the searcher metric is NaN; report a real number (training may have diverged)")
    return float(value)
