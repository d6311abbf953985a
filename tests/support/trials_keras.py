"""TFKerasTrials for the Keras tests (imported by test files and by launcher subprocesses)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from determined_trials import keras as det_keras

keras = det_keras.callbacks.keras


class Recorder(keras.callbacks.Callback):  # type: ignore[misc]
    """Records every callback call, and the weight and logs after each training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []
        self.weights: list[float] = []
        self.losses: list[float] = []

    def on_train_begin(self, logs: Any = None) -> None:
        self.calls.append(("train_begin", None))

    def on_train_end(self, logs: Any = None) -> None:
        self.calls.append(("train_end", None))

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.calls.append(("epoch_begin", epoch))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.calls.append(("epoch_end", epoch))

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.calls.append(("batch_end", batch))
        self.weights.append(float(np.ravel(self.model.get_weights()[0])[0]))
        self.losses.append(float(logs["loss"]))

    def on_test_begin(self, logs: Any = None) -> None:
        self.calls.append(("test_begin", None))

    def on_test_end(self, logs: Any = None) -> None:
        self.calls.append(("test_end", dict(logs or {})))


class OneVarTrial(det_keras.TFKerasTrial):
    """y = 2x, one weight starting at 0, SGD on mean squared error: a closed form per batch."""

    def __init__(self, context: det_keras.TFKerasTrialContext) -> None:
        super().__init__(context)
        self.recorder = Recorder()
        context.configure_fit(shuffle=bool(context.get_hparams().get("shuffle", False)))

    def build_model(self) -> Any:
        model = keras.Sequential([keras.Input((1,)),
                                  keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
        model = self.context.wrap_model(model)
        model.compile(optimizer=keras.optimizers.SGD(self.context.get_hparam("lr")), loss="mse")
        return model

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        x = (np.arange(self.context.get_hparams().get("records", 10), dtype="float32") + 1).reshape(-1, 1) / 10
        return x, 2 * x

    def build_training_data_loader(self) -> Any:
        return self.data()

    def build_validation_data_loader(self) -> Any:
        return self.data()

    def keras_callbacks(self) -> list[Any]:
        return [self.recorder]


class _Blobs(keras.utils.PyDataset):  # type: ignore[misc]
    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int) -> None:
        super().__init__()
        self.x, self.y, self.batch = x, y, batch

    def __len__(self) -> int:
        return len(self.x) // self.batch

    def __getitem__(self, i: int) -> Any:
        part = slice(i * self.batch, (i + 1) * self.batch)
        return self.x[part], self.y[part]


def blobs(n: int = 96, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable 3-class task on 4 features."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (rng.normal(size=(n, 4)) + np.eye(3, 4)[y] * 3).astype("float32")
    return x, y.astype("int64")


class MLPTrial(det_keras.TFKerasTrial):
    """A small classifier with dropout (a Keras seed generator), Adam and accuracy; arrays or a PyDataset."""

    def build_model(self) -> Any:
        model = keras.Sequential([
            keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(self.context.get_hparams().get("dropout", 0.3)),
            keras.layers.Dense(3),
        ])
        model = self.context.wrap_model(model)
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    def _data(self, seed: int) -> Any:
        x, y = blobs(seed=seed)
        if self.context.get_hparams().get("data") == "pydataset":
            return _Blobs(x, y, self.context.get_per_slot_batch_size())
        return x, y

    def build_training_data_loader(self) -> Any:
        return self._data(0)

    def build_validation_data_loader(self) -> Any:
        return self._data(1)

    def keras_callbacks(self) -> list[Any]:
        hparams = self.context.get_hparams()
        stop_at = hparams.get("stop_at")
        probe = [_Probe(self.context)] if "sleep" in hparams or "fail_at" in hparams else []
        return probe + ([_StopAt(self.context, stop_at)] if stop_at else [])


class _Probe(keras.callbacks.Callback):  # type: ignore[misc]
    """For launcher tests: say each trained batch, sleep, and fail on request (hparams sleep, fail_rank, fail_at)."""

    def __init__(self, context: Any) -> None:
        super().__init__()
        self.context, self.seen = context, 0
        self.rank = context.distributed.get_rank()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seen += 1
        hparams = self.context.get_hparams()
        print(f"rank {self.rank} trained a batch", flush=True)
        if self.rank == hparams.get("fail_rank") and self.seen == hparams.get("fail_at"):
            raise RuntimeError(f"boom on rank {self.rank}")
        time.sleep(float(hparams.get("sleep", 0.0)))


class _StopAt(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self, context: Any, batches: int) -> None:
        super().__init__()
        self.context, self.batches, self.seen = context, batches, 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seen += 1
        if self.seen == self.batches:
            self.context.set_stop_requested(True)
