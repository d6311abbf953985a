"""An MLP on scikit-learn's iris data as a TFKerasTrial (Keras 3, TensorFlow backend)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.datasets import load_iris
from sklearn.model_selection import train_test_split

from determined_trials import keras as det_keras

keras = det_keras.callbacks.keras


def iris_split() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(train, validation) arrays: 120 / 30 records, standardised with the training statistics."""
    x, y = load_iris(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)

    def scale(a: np.ndarray) -> np.ndarray:
        return ((a - mean) / std).astype("float32")

    return (scale(x_train), y_train.astype("int64")), (scale(x_val), y_val.astype("int64"))


class IrisTrial(det_keras.TFKerasTrial):
    def __init__(self, context: det_keras.TFKerasTrialContext) -> None:
        super().__init__(context)
        self.train_data, self.val_data = iris_split()

    def build_model(self) -> Any:
        hidden = self.context.get_hparam("hidden_size")
        model = keras.Sequential([
            keras.Input((4,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dropout(self.context.get_hparam("dropout")),
            keras.layers.Dense(3),
        ])
        model = self.context.wrap_model(model)
        model.compile(
            optimizer=keras.optimizers.Adam(self.context.get_hparam("learning_rate")),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        return model

    def build_training_data_loader(self) -> Any:
        return self.train_data

    def build_validation_data_loader(self) -> Any:
        return self.val_data

    def keras_callbacks(self) -> list[Any]:
        return [det_keras.callbacks.EarlyStopping(monitor="val_loss", patience=5, min_delta=1e-3)]
