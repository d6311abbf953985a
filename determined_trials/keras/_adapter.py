"""The Keras adapter: the loop's "train n batches", "evaluate", "save" and "load" for a TFKerasTrial.

Per batch: one compiled ``train_step`` call and no host sync (unless a callback has batch hooks).
Keras's compiled metrics are reset at each workload start and read once at its boundary.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import tensorflow as tf

from determined_trials.keras import _checkpoint_io as ckpt
from determined_trials.keras._backend import require_tensorflow_backend
from determined_trials.keras._bridge import KerasCallbacks
from determined_trials.keras._context import TFKerasTrialContext
from determined_trials.keras._data import DataSource, make_source
from determined_trials.keras._steps import CompiledSteps
from determined_trials.keras._trial import TFKerasTrial
from determined_trials.loop import Clock, DataShape, HookRunner, StopCheck, TrialAdapter, allgather

__all__ = ["KerasAdapter"]

keras = require_tensorflow_backend()


class KerasAdapter(TrialAdapter):
    """Runs one TFKerasTrial under the loop; everything the trial builds is checked here, before training.
    The chief saves, on the training thread (``SaveMode.SYNC_CHIEF``, the default)."""

    framework = f"tensorflow-{tf.__version__}"

    def __init__(self, trial: TFKerasTrial, context: TFKerasTrialContext, hooks: HookRunner) -> None:
        self._trial, self._context, self._dist, self._hooks = trial, context, context.distributed, hooks
        context.get_per_slot_batch_size()  # global_batch_size set and divisible by the workers
        strategy = context.strategy if context.strategy is not None else tf.distribute.get_strategy()
        with strategy.scope():
            self.model = self._build_model()
        self.callbacks = KerasCallbacks(trial.keras_callbacks(), self.model)
        self._train = make_source(trial.build_training_data_loader(), context, what="build_training_data_loader()",
                                  allgather=partial(allgather, self._dist))
        self._steps = CompiledSteps(self.model, context.strategy)
        try:
            self._steps.build(self._train.sample())
        except ValueError as exc:
            raise ValueError(f"building the model, its compiled loss and metrics on a batch of the training data "
                             f"failed: {exc} (check model.compile(loss=..., metrics=[...]) and the data's shapes)"
                             ) from exc
        self._stream: Iterator[Any] | None = None
        self._validation: DataSource | None = None
        self.callbacks.epoch_logs = self._epoch_logs
        self._last_validation: dict[str, Any] = {}

    def _build_model(self) -> Any:
        name = type(self._trial).__name__
        model = self._trial.build_model()
        if not self._context.models:
            raise RuntimeError(f"{name}.build_model() did not call context.wrap_model(model): wrap the model so the "
                               "harness can train and checkpoint it")
        if model is not self._context.models[0]:
            raise RuntimeError(f"{name}.build_model() must return the model it passed to context.wrap_model(), got "
                               f"{type(model).__qualname__}")
        if not model.compiled or model.optimizer is None:
            raise RuntimeError(f"{name}.build_model() did not compile the model: call model.compile(optimizer=..., "
                               "loss=..., metrics=[...]) before returning it")
        return model

    # -- the adapter interface -----------------------------------------------------------------

    def load(self, path: Path) -> None:
        weights, state = ckpt.read_state(path)
        with tempfile.TemporaryDirectory(prefix="det-keras-load-") as scratch:
            ckpt.apply_state(self.model, weights, state, self.callbacks, Path(scratch))
        self._train.reseed(int(state["data_seed"]))  # a bare script's new trial seed must not change the order

    def load_weights(self, path: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="det-keras-warm-") as scratch:
            ckpt.load_model_weights(self.model, path, Path(scratch))

    def start_training(self, clock: Clock) -> DataShape:
        self._stream = self._train.batches(clock.batches_trained)
        clock.set_closer(self._train.end_epoch)  # after each epoch's end hooks
        self.callbacks.set_params(self._train.epoch_len)
        self.model.stop_training = False
        self.model.reset_metrics()
        return DataShape(self._train.epoch_len, self._train.global_batch_size)

    def train(self, num_batches: int, clock: Clock, should_stop: StopCheck) -> None:
        assert self._stream is not None, "start_training() first"
        model, step, stream, cbs = self.model, self._steps.train, self._stream, self.callbacks
        batch_hooks = cbs.batch_hooks
        cbs.workload_begin(clock.batches_trained, num_batches)
        for _ in range(num_batches):
            batch = next(stream)
            in_epoch = clock.begin()[1]  # without an epoch length: the batches trained, and no epochs
            if batch_hooks:
                cbs.list.on_train_batch_begin(in_epoch)
            logs = step(batch)
            if batch_hooks:
                cbs.list.on_train_batch_end(in_epoch, logs)
            clock.advance()
            if model.stop_training:
                self._context.set_stop_requested(True)
            if should_stop():
                break
        cbs.trained = clock.batches_trained

    def stop_requested(self) -> bool:
        return self._context.get_stop_requested()

    def training_metrics(self) -> dict[str, Any]:
        local = _to_python(self.model.get_metrics_result())
        metrics = self._average_over_workers(local, 1.0)
        self.model.reset_metrics()
        return metrics

    def validate(self, *, test_mode: bool = False) -> dict[str, Any]:
        if self._validation is None:
            data = self._trial.build_validation_data_loader()
            self._validation = make_source(data, self._context, what="build_validation_data_loader()",
                                           allgather=partial(allgather, self._dist))
        steps = 1 if test_mode else self._context.fit_settings.validation_steps
        cbs, test = self.callbacks, self._steps.test
        self.model.reset_metrics()
        cbs.list.on_test_begin()
        records = 0
        for index, batch in enumerate(self._validation.evaluation(steps)):
            if cbs.test_batch_hooks:
                cbs.list.on_test_batch_begin(index)
            logs = test(batch)
            records += len(keras.tree.flatten(batch)[0])
            if cbs.test_batch_hooks:
                cbs.list.on_test_batch_end(index, logs)
        result = self._average_over_workers(_to_python(self.model.get_metrics_result()), float(records))
        self.model.reset_metrics()
        cbs.list.on_test_end(result)
        if self.model.stop_training:  # e.g. EarlyStopping: honoured right after this validation
            self._context.set_stop_requested(True)
        self._last_validation = {f"val_{k}": v for k, v in result.items()}
        return dict(self._last_validation)

    def save(self, path: Path) -> None:
        ckpt.write_state(path, self.model, self._context, self.callbacks, self._trial)
        self.callbacks.checkpoint_end(str(path))

    def close(self) -> None:
        self._stream = None

    # -- helpers -------------------------------------------------------------------------------

    def _epoch_logs(self) -> dict[str, Any]:
        return {**_to_python(self.model.get_metrics_result()), **self._last_validation}

    def _average_over_workers(self, metrics: dict[str, Any], weight: float) -> dict[str, Any]:
        """Each worker's metric results, averaged over the workers weighted by ``weight`` (records)."""
        if self._dist.get_size() == 1:
            return metrics
        gathered = allgather(self._dist, (weight, metrics))
        total = sum(w for w, _ in gathered) or 1.0
        return {key: sum(w * m[key] for w, m in gathered) / total for key in metrics}


def _to_python(logs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in logs.items():
        array = value.numpy() if hasattr(value, "numpy") else value
        out[key] = array.item() if getattr(array, "ndim", 1) == 0 and hasattr(array, "item") else (
            array.tolist() if hasattr(array, "tolist") else array)
    return out
