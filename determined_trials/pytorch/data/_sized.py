"""TrainingStream: one rank's training batches from a map-style (sized) dataset, infinite and resumable, loaded
by a single torch DataLoader, with per-batch worker RNG seeding so that augmentations do not depend on where it
started. Its epochs have a length: the loop's clock decides where they end."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import torch
import torch.utils.data

from determined_trials.pytorch.data._plan import Plan, worker_seed_words
from determined_trials.pytorch.data._stream import StreamLifecycle

__all__ = ["PositionSeededDataset", "StreamBatchSampler", "TrainingStream", "seed_process_rngs"]


def seed_process_rngs(seed: int, position: int, rank: int) -> None:
    """Seed ``random``, ``numpy.random`` and ``torch`` of this (worker) process for one global batch."""
    words = worker_seed_words(seed, position, rank)
    random.seed(int(words[0]) << 32 | int(words[1]))
    np.random.seed(words)
    torch.manual_seed(int(words[2]) << 32 | int(words[3]))


class PositionSeededDataset(torch.utils.data.Dataset[Any]):
    """Wraps the user's dataset in worker processes: each fetch receives ``(position, indices)`` and
    reseeds the worker's RNGs from ``(seed, position, rank)`` before loading the indices.

    ``get_worker_info().dataset`` is this wrapper; the user's dataset is its ``dataset`` attribute, and
    other attribute reads are forwarded to it.
    """

    def __init__(self, dataset: Any, seed: int, rank: int) -> None:
        self.dataset, self.seed, self.rank = dataset, seed, rank

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __getitems__(self, item: tuple[int, list[int]]) -> list[Any]:
        position, indices = item
        seed_process_rngs(self.seed, position, self.rank)
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return list(getitems(indices))
        return [self.dataset[i] for i in indices]

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("dataset")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)


class StreamBatchSampler(torch.utils.data.Sampler[Any]):
    """The torch ``batch_sampler`` of the stream: this rank's index lists from ``start`` on, forever;
    with ``with_position`` each item is ``(global batch position, indices)`` for ``PositionSeededDataset``."""

    def __init__(self, plan: Plan, start: int, with_position: bool) -> None:
        super().__init__()
        self._plan, self._start, self._with_position = plan, start, with_position

    def __iter__(self) -> Iterator[Any]:
        batches = self._plan.batches(self._start)  # returned as is: no generator layer per batch
        return enumerate(batches, start=self._start) if self._with_position else batches


class TrainingStream(StreamLifecycle):
    """One rank's training batches, batch ``start_batch`` onwards, repeating over epochs without end.

    ``position`` is the index of the next batch (batches trained so far, counting the skipped ones);
    ``epoch_len`` the number of steps per epoch; ``epoch_idx``/``batch_in_epoch`` locate the batch that
    ``next()`` returned last. Batch k is a pure function of the loader settings, the
    seed, k, the rank and the number of replicas. Iterating starts the workers; ``close()`` stops them.
    """

    epochs_from_passes: ClassVar[bool] = False

    def __init__(self, loader: torch.utils.data.DataLoader[Any], epoch_len: int, start_batch: int) -> None:
        self._loader = loader
        self._iterator: Iterator[Any] | None = None
        self._closed = False
        self.epoch_len = epoch_len
        self.position = start_batch

    @property
    def loader(self) -> torch.utils.data.DataLoader[Any]:
        """The torch DataLoader that loads the batches (its ``batch_sampler`` is infinite)."""
        return self._loader

    @property
    def epoch_idx(self) -> int:
        """Epoch of the batch last returned by ``next()`` (``(position - 1) // epoch_len``)."""
        return (self.position - 1) // self.epoch_len

    @property
    def batch_in_epoch(self) -> int:
        """Index inside its epoch of the batch last returned by ``next()``."""
        return (self.position - 1) % self.epoch_len

    def __iter__(self) -> TrainingStream:
        return self

    def __next__(self) -> Any:
        batch = next(self.loader_iterator())
        self.position += 1
        return batch

    def loader_iterator(self) -> Iterator[Any]:
        """The torch loader's iterator (started on first use). ``next()`` on it takes a batch without
        the stream's bookkeeping: the caller then ``advance``s the stream by the batches it took."""
        if self._iterator is None:
            if self._closed:
                raise RuntimeError("this TrainingStream was closed; build a new one to keep training")
            self._iterator = iter(self._loader)
        return self._iterator

    def advance(self, batches: int) -> None:
        """Count ``batches`` taken from ``loader_iterator()`` directly."""
        self.position += batches

