"""Samplers for users who build their own data chain (reproducible shuffle, repeat, shard, skip; records
or batches), e.g. ``Sequential -> ReproducibleShuffle -> Repeat -> Distributed -> Batch -> SkipBatch``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any, TypeVar

import numpy as np
import torch.utils.data

from determined_trials.pytorch.data._length import data_length, get_batch_length

__all__ = [
    "DistributedBatchSampler",
    "DistributedSampler",
    "RepeatBatchSampler",
    "RepeatSampler",
    "ReproducibleShuffleBatchSampler",
    "ReproducibleShuffleSampler",
    "SkipBatchSampler",
    "SkipSampler",
    "data_length",
    "get_batch_length",
]

_T = TypeVar("_T")


def _length(wrapped: Any) -> int:
    if not isinstance(wrapped, Sized):
        raise TypeError(f"{type(wrapped).__name__} has no len()")
    return len(wrapped)


class _Wrapper(torch.utils.data.Sampler[_T]):
    """A sampler over another (batch) sampler; len() is the wrapped len() unless said otherwise."""

    def __init__(self, wrapped: Iterable[_T]) -> None:
        super().__init__()
        self._wrapped = wrapped

    def __len__(self) -> int:
        return _length(self._wrapped)

    def __iter__(self) -> Iterator[_T]:
        raise NotImplementedError


class ReproducibleShuffleSampler(_Wrapper[_T]):
    """Each pass shuffles the wrapped sampler's indices with its own ``np.random.RandomState(seed)``:
    successive passes differ, and the sequence of passes is the same for the same seed. Use it before
    skipping and repeating."""

    def __init__(self, sampler: Iterable[_T], seed: int) -> None:
        super().__init__(sampler)
        self._rng = np.random.RandomState(seed)

    def __iter__(self) -> Iterator[_T]:
        items = list(self._wrapped)
        return iter([items[i] for i in self._rng.permutation(len(items))])


class ReproducibleShuffleBatchSampler(ReproducibleShuffleSampler[_T]):
    """``ReproducibleShuffleSampler`` for a batch sampler: the order of the batches is shuffled, their
    contents are kept."""


class RepeatSampler(_Wrapper[_T]):
    """Loops over the wrapped sampler forever (len() is one pass). A pass with no element raises
    RuntimeError instead of spinning."""

    def __iter__(self) -> Iterator[_T]:
        while True:
            empty = True
            for item in self._wrapped:
                empty = False
                yield item
            if empty:
                raise RuntimeError(f"{type(self).__name__}: the wrapped sampler yielded nothing in a whole pass")


class RepeatBatchSampler(RepeatSampler[_T]):
    """``RepeatSampler`` for a batch sampler."""


def _check_shard(num_workers: int, rank: int) -> None:
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_workers:
        raise ValueError(f"rank must be an int in [0, num_workers={num_workers}), got {rank!r}")


class DistributedSampler(_Wrapper[_T]):
    """Keeps the elements whose position modulo ``num_workers`` is ``rank`` (everything for one worker).

    Unlike torch's DistributedSampler it neither shuffles nor pads: ranks can get different lengths on
    a finite input, ``len = n // k + (1 if n % k > rank else 0)``.
    """

    def __init__(self, sampler: Iterable[_T], num_workers: int, rank: int) -> None:
        _check_shard(num_workers, rank)
        super().__init__(sampler)
        self.num_workers, self.rank = num_workers, rank

    def __len__(self) -> int:
        n = _length(self._wrapped)
        return n // self.num_workers + (1 if n % self.num_workers > self.rank else 0)

    def __iter__(self) -> Iterator[_T]:
        if self.num_workers == 1:
            return iter(self._wrapped)
        return (item for i, item in enumerate(self._wrapped) if i % self.num_workers == self.rank)


class DistributedBatchSampler(DistributedSampler[_T]):
    """``DistributedSampler`` for a batch sampler: whole batches are dealt out to the ranks in turn."""

    def __init__(self, batch_sampler: Iterable[_T], num_workers: int, rank: int) -> None:
        super().__init__(batch_sampler, num_workers, rank)


class SkipSampler(_Wrapper[_T]):
    """Drops the first ``skip`` elements of each pass, then yields the rest; len() stays the wrapped len().

    Put it last: after repeating (or it skips again every epoch) and after sharding (it counts this
    rank's elements), e.g. ``SkipBatchSampler(batches, context.get_initial_batch())`` on resume.
    Skipping records is only reproducible with fixed-size batches; prefer ``SkipBatchSampler``.
    """

    def __init__(self, sampler: Iterable[_T], skip: int) -> None:
        if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
            raise ValueError(f"skip must be an int >= 0, got {skip!r}")
        super().__init__(sampler)
        self._skip = skip

    def __iter__(self) -> Iterator[_T]:
        iterator = iter(self._wrapped)
        for _ in range(self._skip):
            if next(iterator, _DONE) is _DONE:
                return iter(())
        return iterator


class SkipBatchSampler(SkipSampler[_T]):
    """``SkipSampler`` for a batch sampler: skips ``skip`` whole batches (no sample is loaded)."""

    def __init__(self, batch_sampler: Iterable[_T], skip: int) -> None:
        super().__init__(batch_sampler, skip)


_DONE = object()
