"""Training-time overhead of ``det.keras.Trainer.fit`` (a TFKerasTrial) over plain Keras ``model.fit``.

Usage: python benchmarks/keras_overhead.py [--rounds 7] [--epochs 8] [--quick]

Both modes train the same model (a 32->64->64->10 MLP, SGD, sparse cross-entropy, accuracy) on the same
synthetic arrays (4000 records, batch 32, so 125 steps per epoch) for the same number of steps, with one
validation pass (1000 records) at the end, in this one process (threads pinned to 1), rounds
interleaved (the order alternates every round):

- ``fit``   ``model.fit(x, y, batch_size=32, epochs=E, shuffle=True, validation_data=..., validation_freq=E,
            verbose=0)``;
- ``trial`` the same model as a TFKerasTrial run by ``Trainer.fit(max_length=Epoch(E),
            reporting_period=Epoch(1), checkpoint_policy="none")``.

What is timed: ``time.perf_counter()`` around building + compiling the model and training it, in both
(``det.keras.init()`` and data generation are outside). ``Trainer.fit`` always ends with a checkpoint (as
Determined does); it is counted as harness overhead. The result is the median of the per-round ratios
trial/fit. On a machine that other jobs load, numbers are noisy: read them with that in mind.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__all__ = ["main"]

SEED, N_TRAIN, N_VAL, FEATURES, CLASSES, BATCH = 1234, 4000, 1000, 32, 10, 32


def _data() -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(SEED)
    weights = rng.normal(size=(FEATURES, CLASSES))
    x = rng.normal(size=(N_TRAIN + N_VAL, FEATURES)).astype("float32")
    y = (x @ weights + 0.5 * rng.normal(size=(N_TRAIN + N_VAL, CLASSES))).argmax(axis=1).astype("int64")
    return (x[:N_TRAIN], y[:N_TRAIN]), (x[N_TRAIN:], y[N_TRAIN:])


def _model(keras: Any) -> Any:
    keras.utils.set_random_seed(SEED)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(CLASSES)])
    return model


def _compile(keras: Any, model: Any) -> Any:
    model.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _time_fit(keras: Any, train: Any, val: Any, epochs: int) -> float:
    start = time.perf_counter()
    model = _compile(keras, _model(keras))
    model.fit(*train, batch_size=BATCH, epochs=epochs, shuffle=True, validation_data=val, validation_freq=epochs,
              verbose=0)
    return time.perf_counter() - start


def _time_trial(det_keras: Any, train: Any, val: Any, epochs: int, run_dir: str) -> float:
    keras = det_keras.callbacks.keras

    class BenchTrial(det_keras.TFKerasTrial):
        def build_model(self) -> Any:
            return _compile(keras, self.context.wrap_model(_model(keras)))

        def build_training_data_loader(self) -> Any:
            return train

        def build_validation_data_loader(self) -> Any:
            return val

    config = {"hyperparameters": {"global_batch_size": BATCH}, "reproducibility": {"experiment_seed": SEED},
              "searcher": {"name": "single", "metric": "val_loss", "max_length": {"epochs": epochs}}}
    with det_keras.init(exp_conf=config, run_dir=run_dir) as context:
        trainer = det_keras.Trainer(BenchTrial(context), context)
        start = time.perf_counter()
        trainer.fit(max_length=det_keras.Epoch(epochs), reporting_period=det_keras.Epoch(1),
                    checkpoint_policy="none", show_progress=False)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 epoch: a smoke run, not a measurement")
    args = parser.parse_args()
    rounds, epochs = (2, 1) if args.quick else (args.rounds, args.epochs)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from determined_trials import keras as det_keras

    keras = det_keras.callbacks.keras
    train, val = _data()
    ratios, times = [], {"fit": [], "trial": []}
    with tempfile.TemporaryDirectory(prefix="det-keras-bench-") as folder:
        for index in range(rounds):
            order = ("fit", "trial") if index % 2 == 0 else ("trial", "fit")
            got = {}
            for mode in order:
                run_dir = os.path.join(folder, f"round{index}")
                got[mode] = (_time_fit(keras, train, val, epochs) if mode == "fit"
                             else _time_trial(det_keras, train, val, epochs, run_dir))
                times[mode].append(got[mode])
            ratios.append(got["trial"] / got["fit"])
            print(f"round {index + 1}: fit {got['fit']:.3f} s  trial {got['trial']:.3f} s  ratio {ratios[-1]:.3f}",
                  flush=True)
    steps = epochs * -(-N_TRAIN // BATCH)
    print(f"steps per run: {steps}; fit median {statistics.median(times['fit']):.3f} s, "
          f"trial median {statistics.median(times['trial']):.3f} s")
    print(f"trial / fit: median of {rounds} per-round ratios {statistics.median(ratios):.3f}x")


if __name__ == "__main__":
    main()
