"""The trial's data as this rank's batches: NumPy arrays (a seeded permutation per epoch, each rank taking
its slice of every global batch), ``keras.utils.PyDataset`` (each item a per-slot batch) and wrapped
``tf.data`` datasets. Training data starts at any global batch without loading the batches before it
(tf.data excepted: it cannot seek, so the skipped batches are read and dropped)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from determined_trials.keras._backend import require_tensorflow_backend
from determined_trials.loop import (
    epoch_permutation,
    global_epoch_len,
    rank_bounds,
    warn_if_short_of_one_batch,
)

__all__ = ["DataSource", "make_source"]

keras = require_tensorflow_backend()


class DataSource:
    """One rank's view of a data set: ``batches(start)`` for training, ``evaluation()`` for validation."""

    epoch_len: int | None = None
    global_batch_size: int | None = None

    def sample(self) -> Any:
        """A batch with the right structure, shapes and dtypes (to build the model); reads no position."""
        raise NotImplementedError

    def batches(self, start: int) -> Iterator[Any]:
        """This rank's training batches from global batch ``start`` on, forever."""
        raise NotImplementedError

    def evaluation(self, steps: int | None) -> Iterator[Any]:
        """This rank's share of one pass (at most ``steps`` batches), in order."""
        raise NotImplementedError

    def end_epoch(self) -> None:
        """Called after each training epoch (``PyDataset.on_epoch_end``)."""

    def reseed(self, seed: int) -> None:
        """Use ``seed`` for the epoch orders (a resumed run keeps its checkpoint's order)."""
        if hasattr(self, "_seed"):
            self._seed = seed


class ArraySource(DataSource):
    """``(x, y[, sample_weight])`` arrays (each a nested structure of arrays of equal length)."""

    def __init__(self, data: tuple[Any, ...], *, per_slot: int, rank: int, size: int, seed: int,
                 shuffle: bool, class_weight: Mapping[int, float] | None, what: str) -> None:
        leaves = [np.asarray(a) for a in keras.tree.flatten(data)]
        lengths = {len(a) if a.ndim else -1 for a in leaves}
        if len(lengths) != 1 or -1 in lengths:
            raise ValueError(f"{what}: every array of (x, y[, sample_weight]) needs the same first dimension "
                             f"(the records); got lengths {sorted(lengths)}")
        self._data = keras.tree.map_structure(np.asarray, data)
        self._n, self._per_slot, self._rank, self._size = lengths.pop(), per_slot, rank, size
        self._seed, self._shuffle = seed, shuffle
        self._class_weight = _class_weight_table(class_weight) if class_weight else None
        self.epoch_len = global_epoch_len(self._n, per_slot, size, drop_last=False)
        self.global_batch_size = per_slot * size
        if self.epoch_len == 0:
            raise ValueError(f"{what}: {self._n} records are too few for one batch on each of {size} worker(s)")
        if what.startswith("build_training"):
            warn_if_short_of_one_batch(self._n, per_slot, size, f"the training data of {what}")

    def _take(self, indices: np.ndarray) -> Any:
        batch = tuple(keras.tree.map_structure(lambda a: a[indices], self._data))
        if self._class_weight is None:
            return batch
        weights = _weights_for(batch[1], self._class_weight)
        if len(batch) > 2:
            weights = weights * np.asarray(batch[2], dtype=np.float32).reshape(len(weights))
        return (batch[0], batch[1], weights)

    def sample(self) -> Any:
        return self._take(np.arange(min(self._per_slot, self._n)))

    def batches(self, start: int) -> Iterator[Any]:
        first_epoch, step = divmod(start, self.epoch_len or 1)
        epoch = first_epoch
        while True:
            order = epoch_permutation(self._n, self._seed, epoch) if self._shuffle else np.arange(self._n)
            for j in range(step, self.epoch_len or 0):
                begin, end = rank_bounds(j, self._n, self._per_slot, self._size, self._rank)
                yield self._take(order[begin:end])
            epoch, step = epoch + 1, 0

    def evaluation(self, steps: int | None) -> Iterator[Any]:
        total = math.ceil(self._n / (self._per_slot * self._size))
        for j in range(total if steps is None else min(steps, total)):
            begin, end = rank_bounds(j, self._n, self._per_slot, self._size, self._rank)
            if end > begin:
                yield self._take(np.arange(begin, end))


class PyDatasetSource(DataSource):
    """A ``keras.utils.PyDataset``: a global batch is ``size`` items, rank r takes the r-th; the item
    order of each epoch is a seeded permutation (``configure_fit(shuffle=False)``: in order)."""

    def __init__(self, dataset: Any, *, rank: int, size: int, seed: int, shuffle: bool, what: str) -> None:
        self._ds, self._rank, self._size, self._seed, self._shuffle = dataset, rank, size, seed, shuffle
        self._items = len(dataset)
        self.epoch_len = self._items // size
        if self.epoch_len == 0:
            raise ValueError(f"{what}: the PyDataset has {self._items} batches, fewer than the {size} workers")
        first = keras.tree.flatten(self.sample())[0]
        self.global_batch_size = len(first) * size

    def sample(self) -> Any:
        return _as_tuple(self._ds[0])

    def batches(self, start: int) -> Iterator[Any]:
        epoch, step = divmod(start, self.epoch_len or 1)
        while True:
            order = epoch_permutation(self._items, self._seed, epoch) if self._shuffle else np.arange(self._items)
            for j in range(step, self.epoch_len or 0):
                yield _as_tuple(self._ds[int(order[j * self._size + self._rank])])
            epoch, step = epoch + 1, 0

    def evaluation(self, steps: int | None) -> Iterator[Any]:
        mine = range(self._rank, self._items, self._size)
        for count, index in enumerate(mine):
            if steps is not None and count >= steps:
                return
            yield _as_tuple(self._ds[index])

    def end_epoch(self) -> None:
        self._ds.on_epoch_end()


class TFDataSource(DataSource):
    """A wrapped ``tf.data.Dataset`` of per-slot batches; training reads ``take(epoch_len).repeat()``
    from ``skip(start)`` (exact when the dataset's own randomness is seeded)."""

    def __init__(self, dataset: Any, *, epoch_len: int | None) -> None:
        self._ds = dataset
        self.epoch_len = epoch_len

    def sample(self) -> Any:
        return _as_tuple(next(iter(self._ds.take(1))))

    def batches(self, start: int) -> Iterator[Any]:
        ds = self._ds.take(self.epoch_len).repeat() if self.epoch_len else self._ds.repeat()  # never runs dry
        for batch in ds.skip(start):
            yield _as_tuple(batch)

    def evaluation(self, steps: int | None) -> Iterator[Any]:
        ds = self._ds if steps is None else self._ds.take(steps)
        for batch in ds:
            yield _as_tuple(batch)


def make_source(data: Any, context: Any, *, what: str, allgather: Any) -> DataSource:
    """The right ``DataSource`` for what ``build_*_data_loader`` returned; a clear error otherwise."""
    import tensorflow as tf

    dist, settings = context.distributed, context.fit_settings
    rank, size, seed = dist.get_rank(), dist.get_size(), context.get_trial_seed()
    if isinstance(data, tf.data.Dataset):
        if not context._is_wrapped(data):
            raise TypeError(f"{what} returned a tf.data.Dataset that did not go through context.wrap_dataset(); "
                            "return context.wrap_dataset(dataset) so the harness can shard and resume it")
        cardinality = int(data.cardinality())
        length = cardinality if cardinality > 0 else None
        if size > 1 and length is not None:
            length = min(allgather(length))
        return TFDataSource(data, epoch_len=length)
    if isinstance(data, keras.utils.PyDataset):
        return PyDatasetSource(data, rank=rank, size=size, seed=seed, shuffle=settings.shuffle, what=what)
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        return ArraySource(tuple(data), per_slot=context.get_per_slot_batch_size(), rank=rank, size=size,
                           seed=seed, shuffle=settings.shuffle, class_weight=settings.class_weight, what=what)
    raise TypeError(f"{what} returned a {type(data).__module__}.{type(data).__qualname__}; return (x, y) or "
                    "(x, y, sample_weight) NumPy arrays, a keras.utils.PyDataset, or context.wrap_dataset(a tf.data "
                    "dataset)")


def _as_tuple(batch: Any) -> Any:
    return tuple(batch) if isinstance(batch, list) else batch


def _class_weight_table(class_weight: Mapping[int, float]) -> np.ndarray:
    table = np.zeros(max(int(k) for k in class_weight) + 1, dtype=np.float32)
    for key, value in class_weight.items():
        table[int(key)] = float(value)
    return table


def _weights_for(y: Any, table: np.ndarray) -> np.ndarray:
    labels = np.asarray(y)
    if labels.ndim > 1 and labels.shape[-1] > 1:
        labels = labels.argmax(axis=-1)
    return table[labels.reshape(len(labels)).astype(np.int64)]
