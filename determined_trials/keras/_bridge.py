"""The trial's Keras callbacks under the loop: the loop's hooks become the Keras calls users expect
(``on_train_begin/end``, ``on_epoch_begin/end``, per-batch and test hooks) and Determined's extra ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from determined_trials.keras._backend import require_tensorflow_backend
from determined_trials.keras.callbacks import Callback

__all__ = ["KerasCallbacks"]

keras = require_tensorflow_backend()
_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
_TEST_BATCH_HOOKS = ("on_test_batch_begin", "on_test_batch_end")


def _overrides(callbacks: Sequence[Any], hooks: tuple[str, ...]) -> bool:
    base = keras.callbacks.Callback
    return any(getattr(type(cb), h, None) is not getattr(base, h) for cb in callbacks for h in hooks)


class KerasCallbacks:
    """Registered in the loop's ``HookRunner``; the adapter calls the per-batch and test methods."""

    def __init__(self, callbacks: Sequence[Any], model: Any) -> None:
        for cb in callbacks:
            if not isinstance(cb, keras.callbacks.Callback):
                raise TypeError(f"keras_callbacks() must return keras.callbacks.Callback objects, got "
                                f"{type(cb).__qualname__}")
        self.list = keras.callbacks.CallbackList(list(callbacks), model=model, add_history=False,
                                                 add_progbar=False)
        self.det = [cb for cb in callbacks if isinstance(cb, Callback)]
        self.batch_hooks = _overrides(callbacks, _BATCH_HOOKS)
        self.test_batch_hooks = _overrides(callbacks, _TEST_BATCH_HOOKS)
        self.epoch_logs: Any = lambda: {}
        self.trained = 0  # batches trained, set by the adapter after each workload
        self._began = False
        self._last_logs: dict[str, Any] = {}

    def set_params(self, epoch_len: int | None) -> None:
        self.list.set_params({"verbose": 0, "epochs": None, "steps": epoch_len})

    # -- loop hooks (HookRunner) ----------------------------------------------------------------

    def on_training_start(self) -> None:
        self._began = True
        self.list.on_train_begin()

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.list.on_epoch_begin(epoch_idx)

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.list.on_epoch_end(epoch_idx, self.epoch_logs())

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        self._last_logs = dict(avg_metrics)
        for cb in self.det:
            cb.on_train_workload_end(self.trained, dict(avg_metrics))

    def on_trial_shutdown(self) -> None:
        if self._began:
            self._began = False
            self.list.on_train_end(self._last_logs)

    # -- called by the adapter ------------------------------------------------------------------

    def workload_begin(self, trained: int, requested: int) -> None:
        for cb in self.det:
            cb.on_train_workload_begin(trained, requested, {})

    def checkpoint_end(self, checkpoint_dir: str) -> None:
        for cb in self.det:
            cb.on_checkpoint_end(checkpoint_dir)

    def get_state(self) -> list[Any]:
        return [(type(cb).__qualname__, cb.get_state()) for cb in self.det]

    def load_state(self, states: list[Any]) -> None:
        """Give each det.keras callback its saved state, in order; a callback whose class saves state only
        since some version (``_optional_state``) may be missing from an older checkpoint: it starts fresh."""
        names = [type(cb).__qualname__ for cb in self.det]
        saved = [name for name, _ in states]
        targets = self.det
        if names != saved:
            targets = [cb for cb in self.det if not getattr(cb, "_optional_state", False)]
            if [type(cb).__qualname__ for cb in targets] != saved:
                raise ValueError(f"the checkpoint holds the state of det.keras callbacks {saved}, but "
                                 f"keras_callbacks() returned {names}; return the same callbacks in the same "
                                 "order to resume")
        for cb, (_, state) in zip(targets, states):
            cb.load_state(state)
