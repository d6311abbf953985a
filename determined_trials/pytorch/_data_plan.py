"""Index plans of the reproducible data chain: which dataset indices make up batch k of a rank, computed
from the epoch order and the global-batch split alone, so any batch can be started at without loading."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, cast

import numpy as np

__all__ = [
    "BatchSamplerPlan",
    "DefaultOrders",
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

_ORDER_TAG = 0x0D5E  # domain tags keep the epoch-order and worker-seed streams independent
_WORKER_TAG = 0x5EED
_MASK64 = (1 << 64) - 1


def derive_seed_words(*words: int, count: int = 4) -> np.ndarray:
    """``count`` uint32 words derived from the integers ``words`` (any sign) by numpy's SeedSequence."""
    return np.random.SeedSequence([w & _MASK64 for w in words]).generate_state(count)


def worker_seed_words(seed: int, position: int, rank: int) -> np.ndarray:
    """Seed words for the RNGs that load global batch ``position`` on ``rank``."""
    return derive_seed_words(_WORKER_TAG, seed, position, rank)


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled order of epoch ``epoch``: a function of ``(seed, epoch)`` only, never of global RNGs."""
    words = derive_seed_words(_ORDER_TAG, seed, epoch)
    return np.random.Generator(np.random.PCG64(words)).permutation(n)


def validate_layout(rank: int, num_replicas: int) -> None:
    """Reject a rank layout that cannot be sharded."""
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be an int in [0, {num_replicas}), got {rank!r}")


def global_epoch_len(n: int, per_rank: int, num_replicas: int, drop_last: bool) -> int:
    """Steps per epoch: full global batches, plus the partial one when it is kept (see ``rank_bounds``)."""
    full, rem = divmod(n, per_rank * num_replicas)
    return full + (1 if rem >= num_replicas and not drop_last else 0)


def rank_bounds(step: int, n: int, per_rank: int, num_replicas: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` in the epoch order of ``rank``'s batch at in-epoch ``step``.

    A full global batch is ``per_rank * num_replicas`` consecutive indices and rank r takes the r-th
    contiguous slice; the final partial global batch is split as evenly as ``np.array_split`` would.
    """
    global_size = per_rank * num_replicas
    full = n // global_size
    if step < full:
        start = step * global_size + rank * per_rank
        return start, start + per_rank
    base, extra = divmod(n - full * global_size, num_replicas)
    start = full * global_size + rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


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

    def batches(self, start: int) -> Iterator[list[int]]:
        first_epoch, step = divmod(start, self.epoch_len)
        n, per_rank, replicas, rank = self._source.n, self._per_rank, self._replicas, self._rank
        for order in self._source.orders(first_epoch):
            # a converted slice of the order: list slices per batch, and neither memory nor a resume
            # cost that grows with the epoch
            window_start, window = 0, cast("list[int]", [])
            for j in range(step, self.epoch_len):
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
