"""Where training is: the current global batch and epoch, as the trainer sets them before each
batch, behind `current_train_batch`, `current_train_epoch`, `is_epoch_start` and `is_epoch_end`."""

from __future__ import annotations

__all__ = ["TrainPosition"]


class TrainPosition:
    """Mixin of `PyTorchTrialContext`: position getters fed by the trainer's `_set_position`."""

    def __init__(self) -> None:
        self._batch_idx: int | None = None
        self._epoch_len: int | None = None
        self._epoch_idx: int | None = None
        self._batch_in_epoch: int | None = None

    def _set_position(
        self,
        batch_idx: int,
        epoch_len: int | None,
        *,
        epoch_idx: int | None = None,
        batch_in_epoch: int | None = None,
    ) -> None:
        """Trainer hook: the 0-based global index of the batch about to train and the epoch length
        in batches. When the length is unknown (a loader without len), `epoch_idx` and
        `batch_in_epoch` may say where the epoch is; `is_epoch_end()` then cannot answer."""
        if batch_idx < 0:
            raise ValueError(f"batch_idx must be >= 0, got {batch_idx}")
        if epoch_len is not None:
            if epoch_len < 1:
                raise ValueError(f"epoch_len must be >= 1 (batches per epoch), got {epoch_len}")
            epoch_idx = batch_in_epoch = None  # derived from batch_idx and epoch_len when asked
        self._batch_idx = batch_idx
        self._epoch_len = epoch_len
        self._epoch_idx = epoch_idx
        self._batch_in_epoch = batch_in_epoch

    def _require_batch_idx(self, what: str) -> int:
        if self._batch_idx is None:
            raise RuntimeError(
                f"{what} needs the current batch, which is only known once training has started: "
                "call it from train_batch (or a callback during training)"
            )
        return self._batch_idx

    def current_train_batch(self) -> int:
        """The 0-based global index of the batch being trained (the `batch_idx` of train_batch)."""
        return self._require_batch_idx("current_train_batch()")

    def current_train_epoch(self) -> int:
        """The 0-based index of the epoch being trained (the `epoch_idx` of train_batch)."""
        return self._epoch_position("current_train_epoch()")[0]

    def is_epoch_start(self) -> bool:
        """Whether the current batch is the first of its epoch."""
        return self._epoch_position("is_epoch_start()")[1] == 0

    def is_epoch_end(self) -> bool:
        """Whether the current batch is the last of its epoch."""
        in_epoch = self._epoch_position("is_epoch_end()")[1]
        if self._epoch_len is None:
            raise RuntimeError(_UNKNOWN_EPOCH.format(what="is_epoch_end()"))
        return in_epoch == self._epoch_len - 1

    def _epoch_position(self, what: str) -> tuple[int, int]:
        batch_idx = self._require_batch_idx(what)
        if self._epoch_len:  # the trainer may set only `_batch_idx` per batch once the length is set
            return divmod(batch_idx, self._epoch_len)
        if self._epoch_idx is None or self._batch_in_epoch is None:
            raise RuntimeError(_UNKNOWN_EPOCH.format(what=what))
        return self._epoch_idx, self._batch_in_epoch


_UNKNOWN_EPOCH = (
    "{what} needs the epoch length, but the training data loader has no len(); use a "
    "det.pytorch.DataLoader or a loader over a sized dataset"
)
