"""``det.keras.DeterminedCallback``: a Keras callback that connects a plain ``model.fit`` to the Core API
(metrics, progress, checkpoints every N epochs, preemption, resume at the next epoch)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from determined_trials.core import trial_progress
from determined_trials.keras._backend import require_tensorflow_backend

__all__ = ["DeterminedCallback"]

keras = require_tensorflow_backend()
_KerasCallback: Any = keras.callbacks.Callback
_WEIGHTS = "model.weights.h5"
_STATE = "callback_state.json"


class DeterminedCallback(_KerasCallback):
    """Use inside ``with det.core.init() as core_context: model.fit(..., callbacks=[DeterminedCallback(...)])``.

    ``checkpoint``: a checkpoint id to start from (None: fresh). ``continue_id``: when it equals the id saved
    in that checkpoint, training continues at the epoch after it with the saved counters; otherwise the
    weights are a warm start (epoch 0, counters 0). ``train_metrics_report_period``: "epoch" or a number of
    batches. ``checkpoint_epochs``: checkpoint every N epochs (0: only at a preemption and at the end).
    """

    def __init__(self, core_context: Any, checkpoint: str | None, continue_id: Any, *,
                 train_metrics_report_period: int | str = "epoch", checkpoint_epochs: int = 1) -> None:
        super().__init__()
        period = train_metrics_report_period
        if period != "epoch" and (isinstance(period, bool) or not isinstance(period, int) or period < 1):
            raise ValueError(f"train_metrics_report_period must be 'epoch' or an int >= 1, got {period!r}")
        if isinstance(checkpoint_epochs, bool) or not isinstance(checkpoint_epochs, int) or checkpoint_epochs < 0:
            raise ValueError(f"checkpoint_epochs must be an int >= 0, got {checkpoint_epochs!r}")
        self._core, self._checkpoint, self._continue_id = core_context, checkpoint, continue_id
        self._period, self._every = period, checkpoint_epochs
        self._is_chief = core_context.distributed.get_rank() == 0
        self.steps_completed = 0
        self._epoch = -1  # last finished epoch
        self._saved_epoch = -1
        self._epochs: int | None = None

    # -- checkpoints (overridable) --------------------------------------------------------------

    def save_model(self, model: Any, path: Path) -> None:
        """Write the model (weights and optimizer state) into ``path``."""
        model.save_weights(str(path / _WEIGHTS))

    def load_model(self, model: Any, path: Path) -> None:
        """Load what ``save_model`` wrote (the optimizer is built first so its state loads too)."""
        if model.built and model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model.load_weights(str(path / _WEIGHTS))

    def _save(self) -> None:
        self._saved_epoch = self._epoch
        if not self._is_chief:
            return
        self._core.train.set_status("checkpointing")
        state = {"epoch": self._epoch, "steps_completed": self.steps_completed, "continue_id": self._continue_id}
        with self._core.checkpoint.store_path({"steps_completed": self.steps_completed}) as (path, _):
            self.save_model(self.model, path)
            (path / _STATE).write_text(json.dumps(state, default=str))
        self._core.train.set_status("training")

    def _restore(self) -> None:
        self._core.train.set_status("restoring")
        assert self._checkpoint is not None
        with self._core.checkpoint.restore_path(self._checkpoint) as path:
            self.load_model(self.model, path)
            state = json.loads((path / _STATE).read_text()) if (path / _STATE).exists() else {}
        if state.get("continue_id") == self._continue_id and state:
            self._epoch = self._saved_epoch = int(state["epoch"])
            self.steps_completed = int(state["steps_completed"])
            self.model._initial_epoch = self._epoch + 1  # Keras 3's fit reads it after on_train_begin
        self._core.train.set_status("training")

    # -- Keras hooks ----------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._epochs = (self.params or {}).get("epochs")
        if self._checkpoint is not None:
            self._restore()
        self._core.train.set_status("training")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.steps_completed += 1
        if self._period != "epoch" and self.steps_completed % int(self._period) == 0 and self._is_chief:
            self._report("training", logs or {})

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        logs = dict(logs or {})
        if self._is_chief:
            if self._epochs:  # first: stored with the epoch's report (TrainContext._report)
                self._core.train.report_progress(trial_progress(epoch + 1, self._epochs))
            if self._period == "epoch":
                self._report("training", {k: v for k, v in logs.items() if not k.startswith("val_")})
            validation = {k: v for k, v in logs.items() if k.startswith("val_")}
            if validation:
                self._report("validation", validation)
        if self._every and (epoch + 1) % self._every == 0:
            self._save()
        if self._core.preempt.should_preempt():
            if self._saved_epoch != epoch:
                self._save()
            self.model.stop_training = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._epoch >= 0 and self._saved_epoch != self._epoch:
            self._save()
        if self._is_chief:
            self._core.train.set_status("finishing")

    def _report(self, group: str, logs: dict[str, Any]) -> None:
        metrics = {k: _number(v) for k, v in logs.items() if k not in ("batch", "size")}
        metrics.setdefault("epochs", self._epoch + 1)  # epochs finished (0 before the first one ends)
        metrics.setdefault("batches", self.steps_completed)
        if group == "training":
            self._core.train.report_training_metrics(steps_completed=self.steps_completed, metrics=metrics)
        else:
            self._core.train.report_validation_metrics(steps_completed=self.steps_completed, metrics=metrics)


def _number(value: Any) -> Any:
    value = value.numpy() if hasattr(value, "numpy") else value
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


