"""Metric reducers: the ``Reducer`` enum, the ``MetricReducer`` interface and the registry behind
``context.wrap_reducer`` that reduces every wrapped reducer across ranks with one allgather."""

from __future__ import annotations

import abc
import enum
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = ["MetricReducer", "Reducer", "ReducerRegistry"]

Allgather = Callable[[Any], list[Any]]


class Reducer(enum.Enum):
    """How ``evaluate_batch`` metrics are combined over batches and ranks.

    AVG is the mean weighted by the number of records in each batch; SUM, MAX and MIN act on the
    batch values. Non-scalar metrics are reduced element-wise.
    """

    AVG = 1
    SUM = 2
    MAX = 3
    MIN = 4


class MetricReducer(abc.ABC):
    """A user-defined metric computed across all batches and all ranks.

    Define an ``update(...)`` method of your choosing and call it from ``train_batch`` or
    ``evaluate_batch``; the harness calls ``reset()`` at the start of every training workload
    and every validation, ``per_slot_reduce()`` on every rank at the end (its result must be
    picklable) and ``cross_slot_reduce()`` with the list of every rank's result, in rank order.
    """

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget every update (called before each training workload and each validation)."""

    @abc.abstractmethod
    def per_slot_reduce(self) -> Any:
        """This rank's intermediate result (picklable)."""

    @abc.abstractmethod
    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
        """The final metric from every rank's ``per_slot_reduce()`` result, in rank order."""


class _FunctionReducer(MetricReducer):
    """Collects every ``update(value)`` and calls the wrapped function once on all of them.

    Order rule: the function receives the updates of every rank in the global batch order. Our
    data loader gives rank r the r-th slice of each global batch, so for each batch the updates
    are rank 0's, then rank 1's, and so on. Batches are told apart by the marks the trainer
    places after every batch; updates made after the last mark (or with no marks at all) are
    interleaved round-robin by update index (rank 0's first, rank 1's first, rank 0's second,
    ...), which gives the same order whenever each rank updates once per batch.
    """

    def __init__(self, fn: Callable[[list[Any]], Any]) -> None:
        self.fn = fn
        self._values: list[Any] = []
        self._batch_ends: list[int] = []

    def update(self, value: Any) -> None:
        """Record one value (in ``train_batch`` or ``evaluate_batch``)."""
        self._values.append(value)

    def reset(self) -> None:
        self._values = []
        self._batch_ends = []

    def _mark_batch_end(self) -> None:
        self._batch_ends.append(len(self._values))

    def per_slot_reduce(self) -> tuple[list[Any], list[int]]:
        return self._values, self._batch_ends

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
        return self.fn(_merge_in_order(per_slot_metrics))


_FILLER = object()


def _merge_in_order(per_rank: Sequence[tuple[list[Any], list[int]]]) -> list[Any]:
    """Every rank's updates in global order (see ``_FunctionReducer``)."""
    chunked: list[list[list[Any]]] = []
    tails: list[list[Any]] = []
    for values, ends in per_rank:
        starts = [0, *ends]
        chunked.append([values[a:b] for a, b in zip(starts, ends)])
        tails.append(values[starts[-1]:])
    merged: list[Any] = []
    for batch_chunks in itertools.zip_longest(*chunked, fillvalue=[]):
        for chunk in batch_chunks:
            merged.extend(chunk)
    for row in itertools.zip_longest(*tails, fillvalue=_FILLER):
        merged.extend(value for value in row if value is not _FILLER)
    return merged


class _Entry(NamedTuple):
    reducer: MetricReducer
    name: str | None
    for_training: bool
    for_validation: bool

    def describe(self) -> str:
        if isinstance(self.reducer, _FunctionReducer):
            what = f"reducer function {getattr(self.reducer.fn, '__qualname__', self.reducer.fn)!r}"
        else:
            what = f"MetricReducer {type(self.reducer).__qualname__}"
        return f"{what} (name={self.name!r})"


class ReducerRegistry:
    """The reducers wrapped by ``context.wrap_reducer``, reduced together at each boundary.

    Every rank must wrap the same reducers in the same order (they run the same trial code).
    """

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self._function_reducers: tuple[_FunctionReducer, ...] = ()

    def wrap(
        self,
        reducer: MetricReducer | Callable[[list[Any]], Any],
        name: str | None = None,
        for_training: bool = True,
        for_validation: bool = True,
    ) -> MetricReducer:
        """Register a MetricReducer or a function of the list of all updates; returns the reducer
        to ``update()``. With ``name`` the result is reported under that name; without, the
        reducer must return a dict of metrics."""
        _check_wrap_args(reducer, name, for_training, for_validation)
        for entry in self._entries:
            same_fn = isinstance(entry.reducer, _FunctionReducer) and entry.reducer.fn is reducer
            if entry.reducer is reducer or same_fn:
                raise ValueError(
                    f"{entry.describe()} is already wrapped; wrap each reducer once and call "
                    "update() on the object wrap_reducer returned"
                )
            if name is not None and entry.name == name:
                raise ValueError(
                    f"two reducers are named {name!r}; give each wrapped reducer its own name"
                )
        wrapped = reducer if isinstance(reducer, MetricReducer) else _FunctionReducer(reducer)
        self._entries.append(_Entry(wrapped, name, for_training, for_validation))
        if isinstance(wrapped, _FunctionReducer):
            self._function_reducers = (*self._function_reducers, wrapped)
        return wrapped

    def has_reducers(self, training: bool) -> bool:
        """Whether any reducer is wrapped for training (True) or validation (False)."""
        return bool(self._active(training))

    @property
    def marks_batches(self) -> bool:
        """Whether ``batch_end`` does anything (a function reducer is wrapped)."""
        return bool(self._function_reducers)

    def batch_end(self) -> None:
        """Mark the end of a batch for function reducers (cheap; fixes their update order)."""
        for reducer in self._function_reducers:
            reducer._mark_batch_end()

    def reset(self, training: bool) -> None:
        """Reset the reducers of the coming training workload (True) or validation (False)."""
        for entry in self._active(training):
            _call(entry, "reset")

    def per_slot(self, training: bool) -> list[Any]:
        """This rank's payload: every active reducer's ``per_slot_reduce()``, in order."""
        return [_call(entry, "per_slot_reduce") for entry in self._active(training)]

    def cross_slot(self, training: bool, gathered: Sequence[Sequence[Any]]) -> dict[str, Any]:
        """The metrics from every rank's ``per_slot`` payload (rank order), as Python values."""
        return _cross_slot(self._active(training), gathered)

    def cross_slot_of(self, reducers: Sequence[Any], gathered: Sequence[Sequence[Any]]) -> dict[str, Any]:
        """``cross_slot`` for the given wrapped reducers (what ``wrap`` returned), in their order."""
        entries = []
        for reducer in reducers:
            found = [e for e in self._entries if e.reducer is reducer]
            if not found:
                raise ValueError(f"{type(reducer).__qualname__} object was not wrapped with wrap_reducer; pass "
                                 "the reducers wrap_reducer returned")
            entries.append(found[0])
        return _cross_slot(entries, gathered)

    def reduce(self, training: bool, allgather: Allgather) -> dict[str, Any]:
        """Reduce every active reducer across ranks with ONE allgather (none if no reducers)."""
        if not self.has_reducers(training):
            return {}
        return self.cross_slot(training, allgather(self.per_slot(training)))

    def _active(self, training: bool) -> list[_Entry]:
        return [e for e in self._entries if (e.for_training if training else e.for_validation)]


def _cross_slot(active: Sequence[_Entry], gathered: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The metrics of ``active`` from every rank's payload of their ``per_slot_reduce`` results (rank
    order), as Python values."""
    for rank, payload in enumerate(gathered):
        if len(payload) != len(active):
            raise ValueError(
                f"rank {rank} sent {len(payload)} reducer results but {len(active)} reducers "
                "are wrapped here; every rank must wrap the same reducers in the same order"
            )
    metrics: dict[str, Any] = {}
    owners: dict[str, _Entry] = {}
    for index, entry in enumerate(active):
        result = _call(entry, "cross_slot_reduce", [payload[index] for payload in gathered])
        for key, value in _named_results(entry, result).items():
            if key in owners:
                raise ValueError(
                    f"metric {key!r} is produced by both {owners[key].describe()} and "
                    f"{entry.describe()}; rename one of them"
                )
            owners[key] = entry
            metrics[key] = _to_python(value)
    return metrics


def _check_wrap_args(reducer: Any, name: Any, for_training: Any, for_validation: Any) -> None:
    if isinstance(reducer, type) and issubclass(reducer, MetricReducer):
        raise TypeError(
            f"wrap_reducer got the class {reducer.__qualname__}; pass an instance, e.g. "
            f"wrap_reducer({reducer.__qualname__}())"
        )
    if not isinstance(reducer, MetricReducer) and not callable(reducer):
        raise TypeError(
            f"wrap_reducer takes a MetricReducer instance or a function of a list of values, got "
            f"{type(reducer).__qualname__}"
        )
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"reducer name must be a non-empty string or None, got {name!r}")
    for flag, value in (("for_training", for_training), ("for_validation", for_validation)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be True or False, got {value!r}")
    if not (for_training or for_validation):
        raise ValueError(
            "a reducer with for_training=False and for_validation=False would never be reduced; "
            "set at least one of them"
        )


def _call(entry: _Entry, method: str, *args: Any) -> Any:
    try:
        return getattr(entry.reducer, method)(*args)
    except Exception as exc:  # user code: re-raise naming the reducer
        raise RuntimeError(
            f"{entry.describe()} raised in {method}(): {type(exc).__name__}: {exc}"
        ) from exc


def _named_results(entry: _Entry, result: Any) -> dict[str, Any]:
    if entry.name is None:
        if not isinstance(result, dict):
            raise TypeError(
                f"{entry.describe()} was wrapped with name=None but returned "
                f"{type(result).__qualname__}, not a dict; return a dict of metric name -> "
                "value, or wrap it with name='my_metric'"
            )
        for key in result:
            if not isinstance(key, str):
                raise TypeError(f"{entry.describe()} returned a dict with non-string key {key!r}")
        return result
    if isinstance(result, dict):
        raise TypeError(
            f"{entry.describe()} was wrapped with name set but returned a dict; return a single "
            "value, or wrap it with name=None to report each key of the dict"
        )
    return {entry.name: result}


def _to_python(value: Any) -> Any:
    """Tensors and numpy values as Python numbers or (nested) lists (one element: a number, as in
    Determined); containers recursively."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return value.reshape(()).item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.reshape(()).item() if value.size == 1 else value.tolist()
    if isinstance(value, dict):
        return {key: _to_python(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_python(item) for item in value]
    return value
