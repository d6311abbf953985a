"""Each rank's part of a stream (an ``IterableDataset``): the way each kind of stream is told its rank.

A Hugging Face ``datasets.IterableDataset`` goes through ``datasets.distributed.split_dataset_by_node``; a
stream with ``set_shard(rank, world_size)`` is told its rank and shards itself; any other stream on
several ranks is read whole by every rank and rank r keeps records r, r + world_size, ... (exact, but each
rank reads everything). Data-loader workers split their rank's part themselves, as torch documents for
iterable datasets (``torch.utils.data.get_worker_info()``); Hugging Face streams do it by their shards.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import torch.utils.data

__all__ = ["CountedPass", "EveryNth", "SavesCount", "is_hf_stream", "is_stateful", "is_stream", "shard_stream"]


def is_stream(dataset: Any) -> bool:
    """True for an iterable-style dataset (torch's ``IterableDataset``, Hugging Face's streaming one)."""
    return isinstance(dataset, torch.utils.data.IterableDataset) or is_hf_stream(dataset)


def is_hf_stream(dataset: Any) -> bool:
    """True for a ``datasets.IterableDataset`` (``datasets`` is only looked at once it was imported)."""
    module = sys.modules.get("datasets")
    return module is not None and isinstance(dataset, module.IterableDataset)


def is_stateful(dataset: Any) -> bool:
    """Whether the stream can save its position: ``state_dict()`` and ``load_state_dict()``."""
    return callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))


def shard_stream(dataset: Any, rank: int, world_size: int) -> Any:
    """The stream of ``rank`` out of ``world_size``: disjoint parts that together cover the stream."""
    if world_size == 1:
        return dataset
    if is_hf_stream(dataset):
        from datasets.distributed import split_dataset_by_node

        return split_dataset_by_node(dataset, rank=rank, world_size=world_size)
    set_shard = getattr(dataset, "set_shard", None)
    if callable(set_shard):
        set_shard(rank, world_size)
        return dataset
    return _every_nth(dataset, rank, world_size)


class CountedPass(torch.utils.data.IterableDataset[Any]):
    """A stream wrapper that counts in ``_count`` what it read in the current pass; a count loaded into it
    (``SavesCount``) is taken up by the next pass instead of 0."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._count = 0
        self._restored = False  # a loaded position: the next pass goes on from it

    def _begin_pass(self) -> None:
        """Call in ``__iter__`` (not at the first record: a pass may end before it starts)."""
        if not self._restored:
            self._count = 0
        self._restored = False


class SavesCount:
    """``state_dict``/``load_state_dict`` of a ``CountedPass`` over a stream that saves its position: the
    stream's state and the wrapper's count."""

    dataset: Any
    _count: int
    _restored: bool

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.dataset.state_dict(), "count": self._count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state["stream"])
        self._count, self._restored = int(state["count"]), True


class EveryNth(CountedPass):
    """Records ``rank``, ``rank + n``, ``rank + 2n``, ... of ``dataset`` (a stream that cannot shard itself).
    Saves its position when the stream does: the stream's state plus the records read since the last kept one
    (``_count``, modulo n)."""

    def __init__(self, dataset: Any, rank: int, world_size: int) -> None:
        super().__init__(dataset)
        self._rank, self._n = rank, world_size

    def __iter__(self) -> Iterator[Any]:
        self._begin_pass()
        return self._records(iter(self.dataset))

    def _records(self, records: Iterator[Any]) -> Iterator[Any]:
        rank, n = self._rank, self._n
        for record in records:
            index, self._count = self._count, (self._count + 1) % n
            if index == rank:
                yield record

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch on to the stream (when it takes one)."""
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("dataset")
        if inner is None or name.startswith("__") or name in ("state_dict", "load_state_dict"):
            raise AttributeError(name)
        return getattr(inner, name)


class _StatefulEveryNth(SavesCount, EveryNth):
    """``EveryNth`` over a stream that saves its position."""


def _every_nth(dataset: Any, rank: int, world_size: int) -> EveryNth:
    cls = _StatefulEveryNth if is_stateful(dataset) else EveryNth
    return cls(dataset, rank, world_size)
