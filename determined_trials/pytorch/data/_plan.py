"""Index plans of the reproducible data chain: which dataset indices make up batch k of a rank, computed
from the epoch order and the global-batch split alone, so any batch can be started at without loading."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, cast

import numpy as np

from determined_trials.loop import (
    derive_seed_words,
    epoch_permutation,
    global_epoch_len,
    rank_bounds,
    validate_layout,
    warn_if_short_of_one_batch,
    worker_seed_words,
)

__all__ = [
    "BatchSamplerPlan",
    "DefaultOrders",
    "GroupedPlan",
    "Order",
    "Plan",
    "SampleOrderPlan",
    "SamplerOrders",
    "derive_seed_words",
    "epoch_permutation",
    "global_epoch_len",
    "rank_bounds",
    "validate_layout",
    "worker_seed_words",
]

Order = np.ndarray | list[int]  # one epoch's sample indices


class Plan(Protocol):
    """This rank's batches of index lists, from any global step onwards, forever."""

    epoch_len: int

    def batches(self, start: int) -> Iterator[list[int]]: ...


class DefaultOrders:
    """Epoch orders of a dataset of ``n`` records: a seeded permutation per epoch, or ``0..n-1``."""

    def __init__(self, n: int, shuffle: bool, seed: int) -> None:
        self.n, self._shuffle, self._seed = n, shuffle, seed

    def orders(self, first_epoch: int) -> Iterator[Order]:
        epoch = first_epoch
        while True:
            yield epoch_permutation(self.n, self._seed, epoch) if self._shuffle else np.arange(self.n)
            epoch += 1


def _replay(iterable: Iterable[Any], first_epoch: int) -> None:
    """Bring a stateful (batch) sampler to the state it had at ``first_epoch``; nothing is loaded."""
    set_epoch = getattr(iterable, "set_epoch", None)
    if callable(set_epoch):
        return
    for _ in range(first_epoch):
        for _ in iterable:
            pass


def _start_epoch(iterable: Iterable[Any], epoch: int) -> None:
    set_epoch = getattr(iterable, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


class SamplerOrders:
    """Epoch orders read from a user's sampler, one pass per epoch (``set_epoch(e)`` called when it has
    one; otherwise the earlier epochs are re-iterated to replay its own RNG)."""

    def __init__(self, sampler: Iterable[int]) -> None:
        try:
            self.n = len(sampler)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"the sampler {type(sampler).__name__} has no len(); the reproducible chain needs a fixed "
                "epoch length: give it __len__, or disable the reproducibility checks and return a "
                "torch.utils.data.DataLoader"
            ) from None
        self._sampler = sampler

    def orders(self, first_epoch: int) -> Iterator[Order]:
        _replay(self._sampler, first_epoch)
        epoch = first_epoch
        while True:
            _start_epoch(self._sampler, epoch)
            order = list(self._sampler)
            if len(order) != self.n:
                raise RuntimeError(
                    f"sampler {type(self._sampler).__name__} yielded {len(order)} indices in epoch {epoch} "
                    f"but its len() is {self.n}; the reproducible chain needs every epoch to match len()"
                )
            yield order
            epoch += 1


class _Orders(Protocol):
    n: int

    def orders(self, first_epoch: int) -> Iterator[Order]: ...


def _too_small(have: str, need: str) -> ValueError:
    return ValueError(f"the training data has {have}, too few for one step ({need}): use a smaller batch "
                      "size, more data or fewer ranks")


class SampleOrderPlan:
    """Global batches cut from a per-epoch order of sample indices (default chain and user samplers)."""

    def __init__(self, source: _Orders, per_rank: int, drop_last: bool, rank: int, num_replicas: int) -> None:
        self._source, self._per_rank, self._rank, self._replicas = source, per_rank, rank, num_replicas
        self.epoch_len = global_epoch_len(source.n, per_rank, num_replicas, drop_last)
        if self.epoch_len == 0:
            raise _too_small(f"{source.n} records", f"batch size {per_rank} on {num_replicas} rank(s), "
                             f"drop_last={drop_last}, and every rank needs a non-empty batch")
        warn_if_short_of_one_batch(source.n, per_rank, num_replicas)

    def batches(self, start: int) -> Iterator[list[int]]:
        first_epoch, step = divmod(start, self.epoch_len)
        n, per_rank, replicas, rank = self._source.n, self._per_rank, self._replicas, self._rank
        global_size, offset = per_rank * replicas, rank * per_rank
        full = n // global_size  # steps whose global batch is whole: bounds by arithmetic, no call
        for order in self._source.orders(first_epoch):
            # a converted slice of the order: list slices per batch, and neither memory nor a resume
            # cost that grows with the epoch
            window_start, window = 0, cast("list[int]", [])
            for j in range(step, self.epoch_len):
                if j < full:
                    begin = j * global_size + offset
                    end = begin + per_rank
                else:
                    begin, end = rank_bounds(j, n, per_rank, replicas, rank)
                if begin < window_start or end > window_start + len(window):
                    window_start, window = begin, _as_ints(order[begin:max(end, begin + _WINDOW)])
                yield window[begin - window_start:end - window_start]
            step = 0


_WINDOW = 1 << 14  # indices converted to Python ints at a time


def _as_ints(order: Order) -> list[int]:
    return order.tolist() if isinstance(order, np.ndarray) else [int(i) for i in order]


class BatchSamplerPlan:
    """Global batches made of ``num_replicas`` consecutive batches of a user's batch sampler; rank r takes
    the r-th. A trailing group of fewer than ``num_replicas`` batches is dropped each epoch."""

    def __init__(self, batch_sampler: Iterable[Sequence[int]], rank: int, num_replicas: int) -> None:
        try:
            total = len(batch_sampler)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"the batch_sampler {type(batch_sampler).__name__} has no len(); the reproducible chain needs "
                "a fixed epoch length: give it __len__, or disable the reproducibility checks"
            ) from None
        self._sampler, self._rank, self._replicas, self._total = batch_sampler, rank, num_replicas, total
        self.epoch_len = total // num_replicas
        if self.epoch_len == 0:
            raise _too_small(f"{total} batches from its batch_sampler", f"one batch per rank on {num_replicas} ranks")

    def batches(self, start: int) -> Iterator[list[int]]:
        first_epoch, step = divmod(start, self.epoch_len)
        _replay(self._sampler, first_epoch)
        epoch = first_epoch
        while True:
            _start_epoch(self._sampler, epoch)
            seen = 0
            for seen, batch in enumerate(self._sampler, start=1):  # whole pass, as a replay would do
                j, owner = divmod(seen - 1, self._replicas)
                if step <= j < self.epoch_len and owner == self._rank:
                    yield list(batch)
            if seen < self.epoch_len * self._replicas:
                raise RuntimeError(
                    f"batch_sampler {type(self._sampler).__name__} yielded {seen} batches in epoch {epoch} "
                    f"but its len() is {self._total}; the reproducible chain needs every epoch to match len()"
                )
            epoch, step = epoch + 1, 0


class GroupedPlan:
    """A plan whose steps come in groups of ``group`` (gradient-accumulation micro-batches of one
    DeepSpeed batch): each epoch keeps its first ``(epoch_len // group) * group`` steps and drops the
    rest, so that a group never spans two epochs. ``start`` counts kept steps."""

    def __init__(self, inner: Plan, group: int) -> None:
        if inner.epoch_len < group:
            raise ValueError(
                f"an epoch of the training data has {inner.epoch_len} micro-batches per rank, fewer than the "
                f"{group} micro-batches (gradient_accumulation_steps) of one batch: use more data, a smaller "
                "train_micro_batch_size_per_gpu or fewer gradient_accumulation_steps"
            )
        self._inner, self._group = inner, group
        self.epoch_len = inner.epoch_len // group * group

    def batches(self, start: int) -> Iterator[list[int]]:
        epoch, step = divmod(start, self.epoch_len)
        inner_len = self._inner.epoch_len
        for position, indices in enumerate(self._inner.batches(epoch * inner_len + step), start=step):
            if position % inner_len < self.epoch_len:
                yield indices
