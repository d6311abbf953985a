"""StreamOfPasses: one rank's training batches from a stream (an ``IterableDataset``), one pass per epoch,
loaded by torchdata's ``StatefulDataLoader``, whose ``state_dict()`` is the position saved in checkpoints.

A stream that saves its position (``state_dict``/``load_state_dict``) resumes from it, per data-loader
worker; one that cannot is replayed from its epoch's start and the batches already trained are skipped
(``StatefulDataLoader``'s fast-forward). Each pass gets ``set_epoch(epoch)`` when the stream has it, and
the workers' seeds depend only on (trial seed, rank, epoch).
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

import torch

from determined_trials.pytorch.data._stream import StreamLifecycle, shutdown_loader_iterator
from determined_trials.pytorch.data._worker_seeds import WorkerSeeded

__all__ = ["STREAM_POSITIONS", "StreamOfPasses", "StreamPositions", "in_step", "stateful_loader"]

logger = logging.getLogger("determined_trials.pytorch")

STREAM_POSITIONS = "det.training_stream"  # the harness's callback name in a checkpoint's callbacks


class _NoFastForwardNotice(logging.Filter):
    """Drops torchdata's notice that it replays a stream: ``StreamReplayWarning`` already said so, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "naively fast-forwarding" not in record.getMessage()


def stateful_loader(dataset: Any, **kwargs: Any) -> Any:
    """A torchdata ``StatefulDataLoader`` (a clear error naming the extra when torchdata is missing)."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        raise ImportError(
            "training on a stream (an IterableDataset) needs torchdata's StatefulDataLoader: "
            "pip install 'determined-trials[streaming]'"
        ) from None
    notices = logging.getLogger("torchdata.stateful_dataloader.stateful_dataloader")
    if not any(isinstance(f, _NoFastForwardNotice) for f in notices.filters):
        notices.addFilter(_NoFastForwardNotice())
    with warnings.catch_warnings():  # torchdata 0.11 calls torch's deprecated set_vital on construction
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(dataset, **kwargs)


_IDLE: Iterator[Any] = iter(())  # an exhausted iterator: "no loader iterator", found on the slow path only


class StreamOfPasses(StreamLifecycle):
    """One rank's training batches from a stream: when a pass runs out the next epoch starts a new one.

    ``epoch_len`` is None (a pass's length is not known ahead); ``epoch_idx``/``batch_in_epoch`` locate the
    batch ``next()`` returned last and ``position`` counts the batches taken. ``state_dict()`` is the
    position (epoch, batch in epoch, the loader's state); ``load_state_dict`` before the first ``next()``
    resumes there. A pass that yields no batch at all raises RuntimeError instead of spinning forever.
    Per batch ``next()`` takes the loader's batch and counts it, nothing else: starting, ending and
    resuming passes happen where the loader's iterator raises ``StopIteration``.
    """

    epochs_from_passes: ClassVar[bool] = True

    def __init__(self, loader: Any, dataset: Any, *, seed_of_epoch: Any, start_batch: int = 0) -> None:
        self._loader, self._dataset, self._seed_of_epoch = loader, dataset, seed_of_epoch
        self._iterator: Iterator[Any] = _IDLE
        self._closed = False
        self.epoch_len: int | None = None
        self.epoch_idx, self.batch_in_epoch = 0, -1
        self._before_epoch = start_batch  # batches taken before this epoch's first (``position``'s base)
        self._set_epoch = getattr(dataset, "set_epoch", None)
        self._handed_over = False  # a merged position handed to the workers (``continue_merged``)

    @property
    def loader(self) -> Any:
        """The ``StatefulDataLoader`` that loads the batches."""
        return self._loader

    @property
    def position(self) -> int:
        """The batches taken so far (counting those before a resume)."""
        return self._before_epoch + self.batch_in_epoch + 1

    def state_dict(self) -> dict[str, Any]:
        """This rank's position: the epoch, the batches taken in it and the loader's (workers') state."""
        loader_state = copy.deepcopy(self._loader.state_dict())  # the loader goes on changing its own
        return {"epoch": self.epoch_idx, "in_epoch": self.batch_in_epoch + 1, "loader": loader_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position (before the first ``next()``)."""
        if self._iterator is not _IDLE:
            raise RuntimeError("load_state_dict() must come before the stream's first batch")
        self._move_to(int(state["epoch"]), int(state["in_epoch"]))
        self._start_epoch()
        self._loader.load_state_dict(state["loader"])

    def start_at_epoch(self, epoch: int) -> None:
        """Start at the beginning of ``epoch`` (a position saved on another number of ranks)."""
        self._move_to(epoch, 0)

    @property
    def dataset(self) -> Any:
        """This rank's stream (the user's, or the harness's sharding wrapper)."""
        return self._dataset

    def continue_merged(self, epoch: int, in_epoch: int, stream_state: Any) -> None:
        """Go on in ``epoch`` from ``stream_state``, a position merged from another number of ranks (before
        the first ``next()``; the stream's readers here take it up, each with its own part)."""
        self._move_to(epoch, in_epoch)
        self._start_epoch()
        loaded = self._loader.dataset
        if isinstance(loaded, WorkerSeeded):  # workers: each loads it into its copy when it starts
            loaded.hand_over(stream_state)
            self._handed_over = True
        else:  # this process reads: its next ``__iter__`` takes the state up
            self._dataset.load_state_dict(stream_state)

    def _move_to(self, epoch: int, in_epoch: int) -> None:
        position = self.position
        self.epoch_idx, self.batch_in_epoch = epoch, in_epoch - 1
        self._before_epoch = position - in_epoch

    def close(self) -> None:
        super().close()
        self._iterator = _IDLE

    def __iter__(self) -> StreamOfPasses:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._iterator)
        except StopIteration:
            batch = self._next_pass()
        self.batch_in_epoch += 1
        return batch

    def _next_pass(self) -> Any:
        """The first batch of a new loader iterator: at the start, after a resume, or when a pass ran out."""
        while True:
            if self._iterator is not _IDLE:
                self._end_pass()
            if self._closed:
                raise RuntimeError("this training stream was closed; build a new one to keep training")
            if self.batch_in_epoch < 0:
                self._start_epoch()
            self._iterator = iter(self._loader)
            if self._handed_over:  # the workers started with the merged position: later passes start at 0
                self._loader.dataset.hand_over(None)
                self._handed_over = False
            try:
                return next(self._iterator)
            except StopIteration:
                continue

    def _start_epoch(self) -> None:
        """Tell the stream its epoch and seed the workers' base seed from it."""
        if callable(self._set_epoch):
            self._set_epoch(self.epoch_idx)
        generator = self._loader.generator
        if isinstance(generator, torch.Generator):
            generator.manual_seed(self._seed_of_epoch(self.epoch_idx))

    def _end_pass(self) -> None:
        iterator, self._iterator = self._iterator, _IDLE
        shutdown_loader_iterator(iterator)
        if self.batch_in_epoch < 0:
            raise RuntimeError(
                f"the training stream ({type(self._dataset).__name__}) yielded no batch in a whole pass (epoch "
                f"{self.epoch_idx}): it is empty on this rank, shorter than one batch with drop_last=True, or a "
                "one-shot iterator that is exhausted (training would otherwise wait forever)"
            )
        self._before_epoch += self.batch_in_epoch + 1
        self.epoch_idx, self.batch_in_epoch = self.epoch_idx + 1, -1


class StreamPositions:
    """The harness's callback (named ``STREAM_POSITIONS``) that carries every rank's stream position in each
    checkpoint: ``ranks`` is set on every rank before a checkpoint (one allgather) and saved with the
    callbacks' state; on load the saved list is kept until the stream is built, then ``resume`` applies it."""

    def __init__(self) -> None:
        self.ranks: list[Any] | None = None
        self._restored: list[Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks}

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        saved = (checkpoint.get("callbacks") or {}).get(STREAM_POSITIONS)
        self._restored = None if saved is None else saved.get("ranks")

    def resume(self, stream: StreamOfPasses, rank: int, world_size: int) -> None:
        """Put ``stream`` at the position this rank saved; saved on another number of ranks, at the start of
        the earliest epoch a saved rank was in (with a warning): nothing is lost, records read again."""
        saved, self._restored = self._restored, None
        if saved is None:
            if stream.position > 0:
                logger.warning("the checkpoint holds no stream position (it was not written while training on "
                               "this stream): the stream starts from its beginning")
            return
        if len(saved) == world_size:
            stream.load_state_dict(saved[rank])
            return
        merged = merged_stream_state(stream.dataset, saved)
        if merged is not None:
            logger.info("the stream position was saved on %d rank(s) and this run has %d: the stream merged the "
                        "ranks' positions (merge_state_dicts) and goes on from there", len(saved), world_size)
            stream.continue_merged(int(saved[0]["epoch"]), min(int(p["in_epoch"]) for p in saved), merged)
            return
        epoch = min(int(position["epoch"]) for position in saved)
        logger.warning(
            "the stream position was saved on %d rank(s) and this run has %d: a stream's saved position is a "
            "position in its rank's part, and the parts differ with the number of ranks, so every rank starts "
            "epoch %d from its beginning: no record is lost, but the records of that epoch (and of any later one "
            "a rank had begun) read before the stop are read again (a stream with merge_state_dicts that can merge "
            "the positions goes on exactly: see docs/data.md)",
            len(saved), world_size, epoch,
        )
        stream.start_at_epoch(epoch)


def merged_stream_state(dataset: Any, saved: list[Any]) -> Any:
    """The state from which ``dataset`` goes on exactly after ``saved`` (the positions of a run on another
    number of ranks): its class's ``merge_state_dicts`` applied to every reader's state (rank by rank, worker
    by worker), when the ranks were in one epoch; None when that cannot be (and when the stream says so)."""
    merge = getattr(type(dataset), "merge_state_dicts", None)  # the class's: not a wrapper's forwarding
    if merge is None or len({int(position["epoch"]) for position in saved}) != 1:
        return None
    readers: list[Any] = []
    for position in saved:
        states = _reader_states(position["loader"])
        if states is None:
            return None
        readers += states
    return dataset.merge_state_dicts(readers)


def _reader_states(loader: dict[str, Any]) -> list[Any] | None:
    """The stream's state of each reader in a ``StatefulDataLoader`` state: the loading process's, or each
    worker's (inside the ``WorkerSeeded`` wrapper's); None when one is missing or older than the last batch."""
    snapshot = loader.get("_snapshot")
    if snapshot is None:
        states = [loader.get("dataset_state")]
    elif loader.get("_steps_since_snapshot", 0):
        return None
    else:
        workers = snapshot["_worker_snapshots"]
        states = [(workers[f"worker_{i}"].get("dataset_state") or {}).get("stream") for i in range(len(workers))]
    return None if any(state is None for state in states) else states


def in_step(batches: Iterable[Any], every_rank_has: Callable[[bool], bool]) -> Iterator[Any]:
    """``batches`` as long as every rank still has one (``every_rank_has(mine)``: one small collective per
    batch): ranks whose parts of a stream differ in length run as many steps, so a collective inside a
    step (an FSDP2 forward) never waits for a rank that ran out. The longer parts' tails are not read."""
    iterator = iter(batches)
    while True:
        batch = next(iterator, _END)
        if not every_rank_has(batch is not _END):
            if batch is not _END:
                logger.warning("validation over a stream on several ranks stopped where the shortest rank's part "
                               "ended: the rest of this rank's part was not evaluated (sharded models need every "
                               "rank in each forward)")
            return
        yield batch


_END = object()
