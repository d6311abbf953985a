"""The epoch cursor: which epoch is open, the epoch hooks around it and the trial state's batch and epoch counts."""

from __future__ import annotations

from collections.abc import Callable

from determined_trials.loop._hooks import HookRunner
from determined_trials.loop._state import TrialState

__all__ = ["EpochCursor"]


class EpochCursor:
    """Opens and closes the training epochs of one adapter, calls ``on_training_epoch_start`` /
    ``on_training_epoch_end`` and advances ``batches_trained`` / ``epochs_trained``.

    The adapter calls ``enter`` before a batch (or a run of batches within one epoch) and ``advance``
    after it. An epoch opens at its first batch; a run resumed mid-epoch adopts the epoch that was
    opened before the stop (its start hook is not called again); a raw loader's pass shorter than the
    epoch length is closed when the next one begins. ``on_close`` (e.g. Keras's data ``end_epoch``)
    runs after each epoch's end hook.
    """

    __slots__ = ("_hooks", "_on_close", "current")

    def __init__(self, hooks: HookRunner, on_close: Callable[[], None] | None = None) -> None:
        self._hooks = hooks
        self._on_close = on_close
        self.current: int | None = None  # the open epoch, None between epochs

    def enter(self, epoch_idx: int, in_epoch: int, state: TrialState) -> None:
        """Before training from batch ``in_epoch`` of epoch ``epoch_idx``: open it at its first batch,
        else adopt it if none is open."""
        if in_epoch == 0:
            self.open(epoch_idx, state)
        elif self.current is None:  # resumed mid-epoch: it was opened before the stop
            self.current = epoch_idx

    def advance(self, state: TrialState, batches: int, epoch_ended: bool = False) -> None:
        """Count ``batches`` trained batches; close the open epoch when the last of them ended it."""
        state.batches_trained += batches
        if epoch_ended:
            self.close(state)

    def open(self, epoch_idx: int, state: TrialState) -> None:
        """Start ``epoch_idx``, first closing an epoch still open (a raw loader's shorter pass)."""
        if self.current is not None:
            self.close(state)
        self.current = epoch_idx
        self._hooks.call("on_training_epoch_start", epoch_idx)

    def close(self, state: TrialState) -> None:
        """End the open epoch: its end hook, ``on_close``, one more epoch trained."""
        epoch_idx, self.current = self.current, None
        self._hooks.call("on_training_epoch_end", epoch_idx)
        if self._on_close is not None:
            self._on_close()
        state.epochs_trained += 1
