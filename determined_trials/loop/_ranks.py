"""The cross-rank steps every adapter shares: an allgather that is free on one process, and the
reduction of a workload's metrics (this rank's summary and reducer values, one allgather, combined)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from determined_trials.core import DistributedContext

__all__ = ["allgather", "reduce_across_ranks"]


class Summarised(Protocol):
    """Batch-reduced metrics of one rank (``pytorch``'s ``TrainingMetrics`` / ``ValidationMetrics``)."""

    def summary(self) -> Any: ...

    def combine(self, summaries: Sequence[Any]) -> dict[str, Any]: ...


class Reducers(Protocol):
    """The reducers a trial wrapped (``pytorch``'s ``ReducerRegistry``)."""

    def has_reducers(self, training: bool) -> bool: ...

    def per_slot(self, training: bool) -> list[Any]: ...

    def cross_slot(self, training: bool, gathered: Sequence[Sequence[Any]]) -> dict[str, Any]: ...


def allgather(dist: DistributedContext, payload: Any) -> list[Any]:
    """Every rank's ``payload`` in rank order; no collective on one process."""
    return dist.allgather(payload) if dist.get_size() > 1 else [payload]


def reduce_across_ranks(dist: DistributedContext, metrics: Summarised, reducers: Reducers, training: bool, *,
                        reports: bool = True, extra: Any = None) -> tuple[dict[str, Any], list[Any]]:
    """The metrics of every rank that ``reports``: each sends ``metrics.summary()``, its reducers'
    per-slot values for training (True) or validation (False) and ``extra``, in ONE allgather; the
    result is ``metrics.combine`` of the summaries with the reducers' cross-slot metrics, and the
    reporting ranks' ``extra`` in rank order. Call it on every rank."""
    payload = (metrics.summary(), reducers.per_slot(training), extra) if reports else None
    gathered = [g for g in allgather(dist, payload) if g is not None]
    result = metrics.combine([g[0] for g in gathered])
    if gathered and reducers.has_reducers(training):
        result.update(reducers.cross_slot(training, [g[1] for g in gathered]))
    return result, [g[2] for g in gathered]
