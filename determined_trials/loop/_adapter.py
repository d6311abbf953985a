"""The interface every framework adapter offers the one loop (PyTorch, DeepSpeed, Keras)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from determined_trials.loop._clock import Clock

__all__ = ["DataShape", "TrialAdapter"]


@dataclasses.dataclass(frozen=True)
class DataShape:
    """What the loop needs to know of the training data to turn units into batches."""

    epoch_len: int | None
    global_batch_size: int | None


class TrialAdapter(Protocol):
    """Turns "train n batches", "evaluate", "save" and "load" into framework calls.

    Every method is called on every rank, except ``save`` (chief only unless ``sharded_save``). Metrics returned by
    ``training_metrics`` and ``validate`` are already reduced across batches and ranks and are
    the same on every rank.
    """

    framework: str
    #: Optional (read with ``getattr``, default False): when True, ``save`` runs on every rank into
    #: that rank's shard of one checkpoint (``store_path(shard=True)``), e.g. DeepSpeed engines
    #: whose ranks each hold part of the state; when False only the chief saves.
    # sharded_save: bool
    #: Optional asynchronous checkpoints (read with ``getattr``; used only without ``sharded_save``):
    #: ``async_save`` (bool, the same on every rank), ``snapshot() -> Any`` (chief, training thread:
    #: a host-memory copy of what ``save`` writes, so training may go on) and
    #: ``write_snapshot(snapshot, path)`` (chief, the loop's writer thread: write it into ``path``) and
    #: ``wants_snapshot() -> bool`` (chief: False when the state is small enough that ``save`` on the
    #: training thread, with only the publish in the background, costs less than a copy).
    # async_save: bool
    #: Optional ``prepare_checkpoint()`` (read with ``getattr``): called on every rank at each checkpoint
    #: before anything is saved, e.g. to gather what only each rank knows (its position in a stream).

    def load(self, path: Path) -> None:
        """Restore models, optimizers, RNGs and callback state from a checkpoint folder."""

    def start_training(self, clock: Clock) -> DataShape:
        """Build the training data stream positioned after ``clock.batches_trained`` batches (the loop then
        starts the clock with the shape's epoch length); hand ``clock.view`` to whatever reads the position."""

    def train(self, num_batches: int, clock: Clock, should_stop: Callable[[], bool]) -> None:
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
        (chief only, or every rank into its shard when ``sharded_save`` is True)."""

    def close(self) -> None:
        """Release data loader workers and other resources; idempotent."""
