"""A TFKerasTrial warm-started from another trial's checkpoint (``searcher.source_trial_id`` /
``source_checkpoint_uuid``): training begins with the source model's layer weights, a fresh optimizer (no
iterations, no moments) and fresh counters; a model that does not fit names the first mismatched key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from support.helpers_warm_start import as_warm_started_trial  # noqa: E402
from trials_keras import MLPTrial  # noqa: E402

from determined_trials import keras as det_keras  # noqa: E402
from determined_trials.core import LocalStore  # noqa: E402

keras = det_keras.callbacks.keras
HPARAMS = {"global_batch_size": 8}


def _config() -> dict[str, Any]:
    return {"hyperparameters": HPARAMS, "reproducibility": {"experiment_seed": 7},
            "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 3}}}


def _dense(model: Any) -> list[list[np.ndarray]]:
    return [layer.get_weights() for layer in model.layers if isinstance(layer, keras.layers.Dense)]


class _AtStart(keras.callbacks.Callback):  # type: ignore[misc]
    """What the model holds when training begins (after any load): its dense layers, the optimizer's steps."""

    seen: dict[str, Any] | None = None

    def on_train_begin(self, logs: Any = None) -> None:
        _AtStart.seen = {"dense": _dense(self.model), "iterations": int(self.model.optimizer.iterations.numpy()),
                         "moments": [float(np.abs(v.numpy()).sum()) for v in self.model.optimizer.variables[2:]]}


class _Probed(MLPTrial):
    def keras_callbacks(self) -> list[Any]:
        return [_AtStart()]


class _Narrow(_Probed):
    def build_model(self) -> Any:
        model = self.context.wrap_model(keras.Sequential([
            keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]))
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model


def _source(run_dir: Path) -> tuple[list[list[np.ndarray]], str]:
    with det_keras.init(exp_conf=_config(), run_dir=run_dir) as context:
        trial = MLPTrial(context)
        det_keras.Trainer(trial, context).fit(max_length=det_keras.Batch(5), show_progress=False)
        trained, trial_id = _dense(context.models[0]), context.get_trial_id()
    latest = LocalStore(run_dir).latest_checkpoint(trial_id)
    assert latest is not None and latest.steps_completed == 5
    return trained, latest.uuid


def test_a_warm_start_loads_the_source_layers_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    trained, uuid = _source(run_dir)
    trial_id = as_warm_started_trial(monkeypatch, run_dir, _config(), uuid)
    _AtStart.seen = None
    with det_keras.init() as context:
        trial = _Probed(context)
        det_keras.Trainer(trial, context).fit(max_length=det_keras.Batch(3), show_progress=False)
    assert _AtStart.seen is not None
    for got, want in zip(_AtStart.seen["dense"], trained, strict=True):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)  # the source's weights exactly
    moments = _AtStart.seen["moments"]
    assert _AtStart.seen["iterations"] == 0 and moments and not any(moments)  # a fresh optimizer (built, all zero)
    latest = LocalStore(run_dir).latest_checkpoint(trial_id)
    assert latest is not None and latest.steps_completed == 3  # its own counters, from 0


def test_a_model_that_does_not_fit_names_the_first_mismatched_key(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    _, uuid = _source(run_dir)
    as_warm_started_trial(monkeypatch, run_dir, _config(), uuid)
    _AtStart.seen = None
    with det_keras.init() as context:
        trial = _Narrow(context)
        with pytest.raises(ValueError, match=r"first mismatched key 'layers/dense/vars/0': shape \[4, 16\] in the "
                                             r"checkpoint, \[4, 8\] in the trial's model"):
            det_keras.Trainer(trial, context).fit(max_length=det_keras.Batch(3), show_progress=False)
    assert _AtStart.seen is None  # training never began
