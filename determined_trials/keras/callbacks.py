"""``det.keras.callbacks``: Keras callbacks that also see the harness's workloads and checkpoints and
save their state in checkpoints; checkpointable ``EarlyStopping``, ``ReduceLROnPlateau`` and ``TensorBoard``."""

from __future__ import annotations

from typing import Any

from determined_trials.keras._backend import require_tensorflow_backend

__all__ = ["Callback", "EarlyStopping", "ReduceLROnPlateau", "TensorBoard"]

keras = require_tensorflow_backend()
_KerasCallback: Any = keras.callbacks.Callback
_KerasEarlyStopping: Any = keras.callbacks.EarlyStopping
_KerasReduceLROnPlateau: Any = keras.callbacks.ReduceLROnPlateau
_KerasTensorBoard: Any = keras.callbacks.TensorBoard


class Callback(_KerasCallback):
    """A Keras callback with Determined's extra hooks; all are no-ops by default.

    ``on_train_workload_begin`` / ``on_train_workload_end`` frame each run of training batches between
    two boundaries; ``on_checkpoint_end`` follows every checkpoint (chief, with its folder);
    ``get_state`` / ``load_state`` carry picklable state across a pause and resume.
    """

    def on_train_workload_begin(self, total_batches_trained: int, batches_requested: int,
                                logs: dict[str, Any]) -> None:
        """Before a workload of ``batches_requested`` batches."""

    def on_train_workload_end(self, total_batches_trained: int, logs: dict[str, Any]) -> None:
        """After a workload, with its averaged training metrics."""

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        """After a checkpoint's files are written into ``checkpoint_dir`` (chief only)."""

    def get_state(self) -> Any:
        """Picklable state saved with each checkpoint."""
        return None

    def load_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""


class _Resumable(Callback):
    """Keeps loaded state through ``on_train_begin`` (Keras resets it there) and counts validations."""

    _fields: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loaded = False
        self._validations = 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self._loaded:
            super().on_train_begin(logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Acts after each validation instead (``on_test_end``)."""

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        prefixed = {k if k.startswith("val_") else f"val_{k}": v for k, v in (logs or {}).items()}
        super().on_epoch_end(self._validations, prefixed)
        self._validations += 1

    def get_state(self) -> Any:
        return {"validations": self._validations, **{f: _plain(getattr(self, f, None)) for f in self._fields}}

    def load_state(self, state: Any) -> None:
        self._validations = int(state.get("validations", 0))
        for field in self._fields:
            if field in state:
                setattr(self, field, state[field])
        self._loaded = True


class EarlyStopping(_Resumable, _KerasEarlyStopping):
    """Keras's EarlyStopping, judged after each validation (``monitor`` names a ``val_`` metric) and
    checkpointed; stopping becomes a stop request honoured after the current batch."""

    _fields = ("wait", "stopped_epoch", "best", "best_epoch")


class ReduceLROnPlateau(_Resumable, _KerasReduceLROnPlateau):
    """Keras's ReduceLROnPlateau, judged after each validation and checkpointed."""

    _fields = ("wait", "cooldown_counter", "best")


class TensorBoard(Callback, _KerasTensorBoard):
    """Keras's TensorBoard callback writing into the trial's TensorBoard folder (``log_dir`` is set by
    ``det.keras.init``'s context when the callback is built with ``context``), and checkpointed: its
    batch counters (the steps of batch-level summaries) go on from where a resumed run stopped instead
    of starting again at 0. Checkpoints written before it kept state resume with fresh counters."""

    _optional_state = True  # older checkpoints hold no state for it

    def __init__(self, context: Any = None, **kwargs: Any) -> None:
        if context is not None and getattr(context, "_core", None) is not None:
            kwargs["log_dir"] = str(context._core.train.get_tensorboard_path())
        super().__init__(**kwargs)
        self._resumed: tuple[int, int] | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_begin(logs)  # resets the counters (and opens the writers)
        if self._resumed is not None:
            self._global_train_batch, self._global_test_batch = self._resumed

    def get_state(self) -> Any:
        return {"train_batches": int(_plain(self._global_train_batch)),
                "test_batches": int(_plain(self._global_test_batch))}

    def load_state(self, state: Any) -> None:
        self._resumed = (int(state.get("train_batches", 0)), int(state.get("test_batches", 0)))
        self._global_train_batch, self._global_test_batch = self._resumed


def _plain(value: Any) -> Any:
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return value
