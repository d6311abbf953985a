"""The interface every framework adapter offers the one loop (PyTorch, DeepSpeed, Keras): the
``TrialAdapter`` protocol, the ``SaveMode`` an adapter declares and the protocol of each background mode."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from determined_trials.loop._clock import Clock

if TYPE_CHECKING:
    from determined_trials.core import PreemptContext

__all__ = ["DataShape", "SaveMode", "ShardedAsyncSaver", "SnapshotSaver", "StopCheck", "TrialAdapter",
           "first_mismatched_key"]


@dataclasses.dataclass(frozen=True)
class DataShape:
    """What the loop needs to know of the training data to turn units into batches."""

    epoch_len: int | None
    global_batch_size: int | None


class SaveMode(enum.Enum):
    """How the loop writes an adapter's checkpoints (``TrialAdapter.save_mode``). A run's last checkpoint
    (nothing trains after it) is written at once: a background mode saves it as its synchronous kin
    (``ASYNC_SNAPSHOT`` as ``SYNC_CHIEF``, ``ASYNC_SHARDED`` as ``SHARDED``)."""

    SYNC_CHIEF = "sync_chief"
    """The chief calls ``save(path)`` on the training thread (``TrialAdapter`` alone)."""
    SHARDED = "sharded"
    """Every rank calls ``save(path)`` into its shard of one checkpoint (``store_path(shard=True)``), e.g.
    DeepSpeed engines whose ranks each hold part of the state (``TrialAdapter`` alone)."""
    ASYNC_SNAPSHOT = "async_snapshot"
    """The chief's checkpoint is written by a background writer while training goes on: ``SnapshotSaver``."""
    ASYNC_SHARDED = "async_sharded"
    """Every rank writes its shard in the background; the ranks publish once all are done: ``ShardedAsyncSaver``."""

    @property
    def sharded(self) -> bool:
        """Whether every rank saves its shard (else the chief saves alone)."""
        return self in (SaveMode.SHARDED, SaveMode.ASYNC_SHARDED)

    @property
    def background(self) -> bool:
        """Whether checkpoints (but a run's last) are written while training goes on."""
        return self in (SaveMode.ASYNC_SNAPSHOT, SaveMode.ASYNC_SHARDED)


@runtime_checkable
class SnapshotSaver(Protocol):
    """What ``SaveMode.ASYNC_SNAPSHOT`` needs besides ``save``: a large state is copied on the training
    thread and serialised by the loop's writer thread; a small one is ``save``d at once and only fsynced,
    published and recorded by the writer."""

    def wants_snapshot(self) -> bool:
        """Chief: False when the state is small enough that ``save`` on the training thread, with only the
        publish in the background, costs less than a copy."""

    def snapshot(self) -> Any:
        """Chief, training thread: a host-memory copy of what ``save`` writes, so training may go on."""

    def write_snapshot(self, snapshot: Any, path: Path) -> None:
        """Chief, the loop's writer thread: write ``snapshot`` into ``path``."""


@runtime_checkable
class ShardedAsyncSaver(Protocol):
    """What ``SaveMode.ASYNC_SHARDED`` needs besides ``save`` (which writes a run's last checkpoint)."""

    def start_sharded_save(self, path: Path) -> concurrent.futures.Future[Any]:
        """Every rank: start writing this rank's shard into ``path``; the loop waits for the returned
        future on every rank before the chief publishes the checkpoint."""


class StopCheck:
    """The stop check the loop gives ``TrialAdapter.train``: call it after a batch; True means stop now (the
    loop then knows why). ``decide`` is the same call without this object's ``__call__`` in between.

    ``local_preempt`` is the ``PreemptContext`` when one process decides alone (else None): an adapter may
    then read its ``signalled`` flag and its own stop flag itself and call the check only when one is set,
    which decides the same. With several ranks every call is the ranks' agreed decision."""

    __slots__ = ("decide", "local_preempt")

    def __init__(self, decide: Callable[[], bool], local_preempt: PreemptContext | None = None) -> None:
        self.decide = decide
        self.local_preempt = local_preempt

    def __call__(self) -> bool:
        return self.decide()


class TrialAdapter(Protocol):
    """Turns "train n batches", "evaluate", "save" and "load" into framework calls.

    Every method is called on every rank, except ``save`` (chief only unless ``save_mode.sharded``). Metrics
    returned by ``training_metrics`` and ``validate`` are already reduced across batches and ranks and are
    the same on every rank. An adapter subclasses this protocol to inherit the defaults of ``save_mode``,
    ``prepare_checkpoint``, ``batch_metrics`` and ``take_data_wait``.
    """

    framework: str

    @property
    def save_mode(self) -> SaveMode:
        """How the loop writes checkpoints, read at each checkpoint; a background mode's adapter implements
        that mode's protocol too (``SnapshotSaver``, ``ShardedAsyncSaver``). Default: ``SYNC_CHIEF``."""
        return SaveMode.SYNC_CHIEF

    def prepare_checkpoint(self) -> None:
        """Every rank, at each checkpoint before anything is saved, e.g. to gather what only each rank
        knows (its position in a stream). Default: nothing."""
        return None

    def batch_metrics(self) -> list[dict[str, Any]]:
        """The last workload's per-batch metrics for ``on_training_workload_end``. Default: none kept."""
        return []

    def take_data_wait(self) -> float:
        """Seconds spent waiting for training data since the last call, as far as the adapter knows it without
        a per-batch cost (the trial's ``data_wait`` time part; the loop asks after each workload). Default: 0."""
        return 0.0

    def load(self, path: Path) -> None:
        """Restore models, optimizers, RNGs and callback state from a checkpoint folder."""

    def load_weights(self, path: Path) -> None:
        """A warm start: load only the models' weights of a checkpoint folder (another trial's) into the built
        models; a checkpoint whose models do not fit raises, naming the first mismatched key."""

    def start_training(self, clock: Clock) -> DataShape:
        """Build the training data stream positioned after ``clock.batches_trained`` batches (the loop then
        starts the clock with the shape's epoch length); hand ``clock.view`` to whatever reads the position."""

    def train(self, num_batches: int, clock: Clock, should_stop: StopCheck) -> None:
        """Train up to ``num_batches`` batches; stop early after a batch where ``should_stop()`` is True.

        The adapter reports its batches to the clock (``loop/_clock.py``): ``begin`` or ``begin_pass``
        before, ``advance`` after. The clock, not the adapter, opens and closes epochs, calls the epoch
        hooks and counts."""

    def stop_requested(self) -> bool:
        """Whether the trial asked to stop (``context.set_stop_requested(True)``)."""

    def training_metrics(self) -> dict[str, Any]:
        """The workload's training metrics (one host transfer, one collective) and reset them."""

    def validate(self, *, test_mode: bool = False) -> dict[str, Any]:
        """Evaluate on the validation data; the reduced metrics, the same on every rank."""

    def save(self, path: Path) -> None:
        """Write the framework state (models, optimizers, RNGs, callbacks...) into ``path``
        (chief only, or every rank into its shard when ``save_mode.sharded``)."""

    def close(self) -> None:
        """Release data loader workers and other resources; idempotent."""


def first_mismatched_key(saved: Mapping[str, Any], own: Mapping[str, Any]) -> str | None:
    """Why a checkpoint's model (``saved``: key -> shape) does not fit the trial's (``own``), naming the first
    mismatched key: in ``own``'s order a key missing from ``saved`` or of another shape, then a key only
    ``saved`` has; None when they fit (``load_weights`` of every adapter)."""
    for key, shape in own.items():
        if key not in saved:
            return f"{key!r}: in the trial's model but not in the checkpoint"
        if saved[key] != shape:
            return (f"{key!r}: shape {list(saved[key] or [])} in the checkpoint, {list(shape or [])} in the "
                    "trial's model")
    extra = next((key for key in saved if key not in own), None)
    return None if extra is None else f"{extra!r}: in the checkpoint but not in the trial's model"
