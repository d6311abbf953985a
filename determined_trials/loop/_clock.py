"""The trial's one clock: the counters a checkpoint saves, the epochs with their hooks and the batch being
trained. The loop owns and advances it from what the adapters report; contexts and streams read it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from determined_trials.loop._hooks import HookRunner

__all__ = ["COUNTERS", "Clock", "ClockView"]

COUNTERS = ("trial_id", "batches_trained", "epochs_trained", "last_validation", "last_checkpoint",
            "searcher_ops_completed")
"""The clock's part saved with every checkpoint (``trial_state.json``), in this order."""


class Clock:
    """Where the trial is. One object per ``fit``, made by the loop's ``Controller``.

    - Counters (``state_dict``, plain ints): ``batches_trained`` (also the position of the training data:
      resuming skips exactly that many global batches), ``epochs_trained``, ``last_validation`` and
      ``last_checkpoint`` (batch counts), ``searcher_ops_completed``, ``trial_id``.
    - Epochs: ``epoch_len`` (batches per epoch, None when the data cannot say), ``open_epoch`` (None between
      epochs); an epoch opens at its first batch (``on_training_epoch_start``) and closes after its last one
      (``on_training_epoch_end``, then the closer an adapter set, then one more epoch trained). A run resumed
      mid-epoch adopts its epoch without a second start hook.
    - The data position: ``batch_idx``, the global index of the batch being trained (the last one trained
      between batches; None before the first), and where it lies in its epoch (``epoch_position``).

    The loop calls ``start`` once the training data is built, sets the boundary counters and loads and saves
    the state. An adapter reports its batches: ``begin`` (epochs by length) or ``begin_pass`` (epochs by the
    data's passes) before a batch or a run of them, ``advance`` after. The one field an adapter writes itself
    is ``batch_idx``, per batch inside a run that ``begin`` opened (one store, the cost of the old position).
    Contexts and streams get ``view``, which only reads.
    """

    __slots__ = (*COUNTERS, "epoch_len", "batch_idx", "open_epoch", "_pass", "_hooks", "_closer", "view")

    def __init__(self, hooks: HookRunner | None = None, *, trial_id: int = 0, batches_trained: int = 0,
                 epochs_trained: int = 0, last_validation: int = 0, last_checkpoint: int = 0,
                 searcher_ops_completed: int = 0) -> None:
        self.trial_id, self.batches_trained, self.epochs_trained = trial_id, batches_trained, epochs_trained
        self.last_validation, self.last_checkpoint = last_validation, last_checkpoint
        self.searcher_ops_completed = searcher_ops_completed
        self.epoch_len: int | None = None
        self.batch_idx: int | None = None
        self.open_epoch: int | None = None
        self._pass: tuple[int, int] | None = None  # (epoch, batch in epoch) of a batch whose pass decides
        self._hooks = hooks if hooks is not None else HookRunner({})
        self._closer: Callable[[], None] | None = None
        self.view = ClockView(self)

    # -- the checkpointed counters -------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """Plain ints, loadable with ``torch.load(weights_only=True)`` or JSON."""
        return {name: getattr(self, name) for name in COUNTERS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from ``state_dict()`` output; unknown keys are an error."""
        unknown = set(state) - set(COUNTERS)
        if unknown:
            raise ValueError(f"unknown trial state keys {sorted(unknown)}; was the checkpoint written by another tool?")
        for key, value in state.items():
            setattr(self, key, int(value))

    # -- what the loop and the adapters tell it ---------------------------------------------------

    def start(self, epoch_len: int | None) -> None:
        """The loop, once the training data is built: its epoch length in batches (0 or None: unknown)."""
        if epoch_len is not None and epoch_len < 0:
            raise ValueError(f"epoch_len must be >= 1 (batches per epoch) or None, got {epoch_len}")
        self.epoch_len = epoch_len or None

    def set_closer(self, closer: Callable[[], None] | None) -> None:
        """Run ``closer`` after the end hooks of each epoch (e.g. Keras's ``PyDataset.on_epoch_end``)."""
        self._closer = closer

    def begin(self, limit: int = 1) -> tuple[int, int, int]:
        """Before a run of up to ``limit`` batches whose epochs the length decides: open the epoch at its first
        batch (adopt it when resumed mid-epoch) and point ``batch_idx`` at the run's first batch.

        Returns (epoch, batch in epoch, batches of the run within this epoch); with no epoch length
        (0, batches trained, ``limit``) and no epoch is opened."""
        first = self.batch_idx = self.batches_trained
        epoch_len = self.epoch_len
        if epoch_len is None:
            return 0, first, limit
        epoch_idx, in_epoch = divmod(first, epoch_len)
        self._enter(epoch_idx, in_epoch)
        return epoch_idx, in_epoch, min(limit, epoch_len - in_epoch)

    def begin_pass(self, epoch_idx: int, in_epoch: int) -> None:
        """Before one batch whose epoch the data's passes decide (a raw loader, a stream): it is batch
        ``in_epoch`` of epoch ``epoch_idx``; a shorter pass's epoch still open is closed first."""
        self.batch_idx = self.batches_trained
        self._pass = (epoch_idx, in_epoch)
        self._enter(epoch_idx, in_epoch)

    def advance(self, batches: int = 1, *, closes: bool = True) -> None:
        """After ``batches`` trained batches: count them and, when the last one ended its epoch, close it
        (``closes=False``: count only, e.g. when the run failed)."""
        self.batches_trained += batches
        if closes and batches and self.open_epoch is not None and self._ends_epoch(self.batches_trained - 1):
            self._close()

    def at_epoch_end(self) -> bool:
        """Whether the batch being trained is the last of its epoch, as ``advance`` decides (by the pass for a
        pass of known length; never with no epoch length)."""
        return self.batch_idx is not None and self._ends_epoch(self.batch_idx)

    def _ends_epoch(self, batch_idx: int) -> bool:
        epoch_len = self.epoch_len
        if epoch_len is None:
            return False
        if self._pass is not None:
            return self._pass[1] + 1 == epoch_len
        return (batch_idx + 1) % epoch_len == 0

    def _enter(self, epoch_idx: int, in_epoch: int) -> None:
        if in_epoch == 0:
            if self.open_epoch is not None:  # a raw loader's shorter pass
                self._close()
            self.open_epoch = epoch_idx
            self._hooks.call("on_training_epoch_start", epoch_idx)
        elif self.open_epoch is None:  # resumed mid-epoch: it was opened before the stop
            self.open_epoch = epoch_idx

    def _close(self) -> None:
        epoch_idx, self.open_epoch = self.open_epoch, None
        self._hooks.call("on_training_epoch_end", epoch_idx)
        if self._closer is not None:
            self._closer()
        self.epochs_trained += 1

    # -- reading -------------------------------------------------------------------------------

    def epoch_position(self) -> tuple[int, int] | None:
        """(epoch, batch in epoch) of ``batch_idx``: by the epoch length when known, else as its pass said;
        None when neither can say (or before the first batch)."""
        batch_idx = self.batch_idx
        if batch_idx is None:
            return None
        if self.epoch_len is not None:
            return divmod(batch_idx, self.epoch_len)
        return self._pass


class ClockView:
    """The clock as contexts and streams see it: they read it, only the loop and the adapters advance it."""

    __slots__ = ("_clock",)

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    @property
    def batch_idx(self) -> int | None:
        """The global index of the batch being trained (the last one trained between batches; None before)."""
        return self._clock.batch_idx

    @property
    def epoch_len(self) -> int | None:
        """Batches per epoch; None when the data cannot say."""
        return self._clock.epoch_len

    @property
    def batches_trained(self) -> int:
        return self._clock.batches_trained

    @property
    def epochs_trained(self) -> int:
        return self._clock.epochs_trained

    def epoch_position(self) -> tuple[int, int] | None:
        """(epoch, batch in epoch) of the batch being trained; None when unknown."""
        return self._clock.epoch_position()
