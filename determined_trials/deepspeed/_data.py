"""The data a DeepSpeedTrial pulls: the training stream of micro-batches (whole batches per epoch,
resumable) and validation iterators that count the records each ``evaluate_batch`` call took."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sized
from typing import Any

from determined_trials.pytorch.data import DataLoader, data_length, wrap_raw_loader

__all__ = ["CountingIterator", "training_stream", "validation_loader"]

logger = logging.getLogger("determined_trials.deepspeed")


def training_stream(loader: Any, *, seed: int, rank: int, size: int, start_batch: int, micro_batches: int,
                    micro_batch_size: int) -> tuple[Any, int | None]:
    """This data-parallel rank's stream of micro-batches from batch ``start_batch`` on, and the epoch
    length in batches (``micro_batches`` micro-batches each); None when a raw loader has no len."""
    stream: Any
    if isinstance(loader, DataLoader):
        if loader.is_stream:
            raise ValueError(
                "DeepSpeedTrial takes map-style datasets only: build_training_data_loader() returned a "
                "det.pytorch.DataLoader over a stream (an IterableDataset), whose epochs cannot be cut into whole "
                "gradient-accumulation groups; use a map-style dataset, or a PyTorchTrial (see docs/data.md)"
            )
        if loader.batch_size is not None and loader.batch_size != micro_batch_size:
            raise ValueError(
                f"build_training_data_loader() returned batch_size={loader.batch_size} but the DeepSpeed config has "
                f"train_micro_batch_size_per_gpu={micro_batch_size}; use "
                "batch_size=context.get_train_micro_batch_size_per_gpu()"
            )
        stream = loader.build_training_stream(seed=seed, rank=rank, num_replicas=size,
                                              start_batch=start_batch * micro_batches, group=micro_batches)
        return stream, stream.epoch_len // micro_batches
    stream = wrap_raw_loader(loader, start_batch=start_batch * micro_batches)
    if stream.epoch_len is None:
        return stream, None
    if stream.epoch_len < micro_batches:
        raise ValueError(f"the training data loader has {stream.epoch_len} micro-batches, fewer than the "
                         f"{micro_batches} (gradient_accumulation_steps) of one batch")
    return stream, stream.epoch_len // micro_batches


def validation_loader(loader: Any, *, seed: int, rank: int, size: int) -> Any:
    """This data-parallel rank's shard of the validation data (a raw loader is used as it is)."""
    if isinstance(loader, DataLoader):
        return loader.build_validation_loader(rank=rank, num_replicas=size, seed=seed)
    return loader


def batches_in(loader: Any) -> int | None:
    """len(loader), or None when it has none."""
    return len(loader) if isinstance(loader, Sized) else None


class CountingIterator:
    """Iterates ``loader`` and counts the records of the batches handed out since ``take_records()``.

    With ``padding`` (ZeRO-3 on several ranks: every forward is a collective, so every rank must make
    as many), a ``loader`` that runs out hands out its last batch again (``padding()`` when it had none),
    counted as no records; ``take_records()`` then says the call saw padding only (None)."""

    def __init__(self, loader: Any, padding: Callable[[], Any] | None = None) -> None:
        self._iterator: Iterator[Any] = iter(loader)
        self._records = 0
        self._padding = padding
        self._real = False  # a real batch was handed out since take_records()
        self._last: Any = None

    def __iter__(self) -> CountingIterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._iterator)
        except StopIteration:
            if self._padding is None:
                raise
            if self._last is None:
                self._last = self._padding()
            return self._last
        self._records += data_length(batch)
        self._real = True
        if self._padding is not None:
            self._last = batch
        return batch

    def take_records(self) -> int | None:
        """Records handed out since the last call; None when only padding was (its metrics are dropped)."""
        records, self._records = self._records, 0
        real, self._real = self._real, False
        return records if real or self._padding is None else None
