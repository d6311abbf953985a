"""WorkerSeeded: a stream read in data-loader workers with each worker's RNGs reseeded before each of its
batches, so that what the stream draws there (augmentations) repeats after a mid-epoch resume.

torchdata's ``StatefulDataLoader`` saves a worker's position in the stream but not its RNGs: a resumed worker
seeds them again from its seed, where the uninterrupted worker's had moved on. Reseeded before every batch
from (the worker's seed, the batch's index in the worker's pass), both runs draw the same numbers. The
worker's seed comes from (trial seed, rank, epoch, worker) and is restored with the loader's state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch.utils.data

from determined_trials.pytorch.data._shard import CountedPass, SavesCount, is_stateful
from determined_trials.pytorch.data._sized import seed_process_rngs

__all__ = ["WorkerSeeded", "worker_seeded"]

_END = object()


class WorkerSeeded(CountedPass):
    """``dataset``'s records; in a data-loader worker, its RNGs are reseeded before each batch of
    ``batch_size`` records (in the main process nothing is added: its RNGs are saved with checkpoints).
    ``_count``: the records this worker took in its pass."""

    def __init__(self, dataset: Any, batch_size: int) -> None:
        super().__init__(dataset)
        self._batch_size = batch_size
        self._handed: Any = None  # a stream state each worker loads before its first pass

    def hand_over(self, state: Any) -> None:
        """In the main process: every worker started from now on loads ``state`` into its copy of the stream
        before its first pass (a position merged from another number of ranks); ``hand_over(None)`` once the
        workers started, so that the next pass's workers start a new pass."""
        self._handed = state

    def __iter__(self) -> Iterator[Any]:
        self._begin_pass()
        handed, self._handed = self._handed, None  # in a worker: its copy's, taken up once
        if handed is not None:
            self.dataset.load_state_dict(handed)
        info = torch.utils.data.get_worker_info()
        records = iter(self.dataset)
        return records if info is None else self._seeded(records, info.seed, info.id)

    def _seeded(self, records: Iterator[Any], seed: int, worker: int) -> Iterator[Any]:
        size = self._batch_size
        while True:
            if self._count % size == 0:
                seed_process_rngs(seed, self._count // size, worker)
            record = next(records, _END)
            if record is _END:
                return
            self._count += 1
            yield record


class _StatefulWorkerSeeded(SavesCount, WorkerSeeded):
    """``WorkerSeeded`` over a stream that saves its position."""


def worker_seeded(dataset: Any, batch_size: int) -> WorkerSeeded:
    """``dataset`` with its workers' RNGs reseeded per batch (stateful when the stream is)."""
    cls = _StatefulWorkerSeeded if is_stateful(dataset) else WorkerSeeded
    return cls(dataset, batch_size)
