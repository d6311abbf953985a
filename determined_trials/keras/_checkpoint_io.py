"""What a TFKerasTrial checkpoint holds: ``model.weights.h5`` (weights and optimizer state), ``model.keras``
(the compiled model, when Keras can serialise it), ``keras_state.pkl`` (every RNG, the Keras seed
generators, det.keras callback state) and ``load_data.json`` (trial class, hparams, config)."""

from __future__ import annotations

import json
import logging
import pickle
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
import tensorflow as tf

from determined_trials.keras._backend import require_tensorflow_backend
from determined_trials.loop import first_mismatched_key

if TYPE_CHECKING:
    from determined_trials.keras._bridge import KerasCallbacks
    from determined_trials.keras._context import TFKerasTrialContext

__all__ = ["LOAD_DATA_FILE", "MODEL_FILE", "STATE_FILE", "WEIGHTS_FILE", "load_model_weights", "read_state",
           "write_state"]

keras = require_tensorflow_backend()
logger = logging.getLogger("determined_trials.keras")

WEIGHTS_FILE = "model.weights.h5"
MODEL_FILE = "model.keras"
STATE_FILE = "keras_state.pkl"
LOAD_DATA_FILE = "load_data.json"
_GLOBAL_SEED_GENERATOR = "global_seed_generator"
_MODEL_GROUPS = ("layers", "vars")  # the model's own weights in a .weights.h5; "optimizer" holds the optimizer's


def _seed_states(model: Any) -> list[Any]:
    return [v for v in model.variables if v.name == "seed_generator_state"]


def _global_keras_generator() -> Any:
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute(_GLOBAL_SEED_GENERATOR)


def capture_rng(model: Any) -> dict[str, Any]:
    """Python, NumPy, TensorFlow and Keras (global and per-layer seed generator) RNG states."""
    keras_global = _global_keras_generator()
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "tf_global_generator": tf.random.get_global_generator().state.numpy(),
        "keras_global": None if keras_global is None else keras_global.state.numpy(),
        "keras_layers": [v.numpy() for v in _seed_states(model)],
    }


def restore_rng(model: Any, state: dict[str, Any]) -> None:
    """Put back what ``capture_rng`` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    tf.random.get_global_generator().state.assign(state["tf_global_generator"])
    if state["keras_global"] is not None:
        from keras.src.random import seed_generator

        seed_generator.global_seed_generator().state.assign(state["keras_global"])
    layers = _seed_states(model)
    if len(layers) != len(state["keras_layers"]):
        raise ValueError(f"the checkpoint has {len(state['keras_layers'])} Keras seed generators but the model has "
                         f"{len(layers)}: build_model() must build the same model to resume")
    for variable, value in zip(layers, state["keras_layers"]):
        variable.assign(value)


def write_state(path: Path, model: Any, context: TFKerasTrialContext, callbacks: KerasCallbacks, trial: Any) -> None:
    """Write the checkpoint files into ``path`` (chief)."""
    model.save_weights(str(path / WEIGHTS_FILE))
    try:
        model.save(str(path / MODEL_FILE))
    except Exception as exc:  # a custom object Keras cannot serialise: weights still resume
        logger.warning("model.keras not written (%s: %s); load the weights into build_model()'s model instead",
                       type(exc).__name__, exc)
        (path / MODEL_FILE).unlink(missing_ok=True)
    state = {"rng": capture_rng(model), "callbacks": callbacks.get_state(), "data_seed": context.get_trial_seed()}
    with open(path / STATE_FILE, "wb") as f:
        pickle.dump(state, f)
    load_data = {
        "trial_type": "TFKerasTrial", "trial_cls": f"{type(trial).__module__}:{type(trial).__qualname__}",
        "hparams": context.get_hparams(), "experiment_config": context.get_experiment_config(),
        "framework": f"tensorflow-{tf.__version__}", "keras": keras.__version__,
    }
    (path / LOAD_DATA_FILE).write_text(json.dumps(load_data, indent=1, default=str))


def read_state(path: Path) -> tuple[bytes, dict[str, Any]]:
    """The weights file's bytes and the pickled state (read now: the folder may go away after)."""
    for name in (WEIGHTS_FILE, STATE_FILE):
        if not (path / name).exists():
            raise FileNotFoundError(f"checkpoint folder {path} has no {name}: it was not written by a TFKerasTrial "
                                    "Trainer")
    with open(path / STATE_FILE, "rb") as f:
        state: dict[str, Any] = pickle.load(f)
    return (path / WEIGHTS_FILE).read_bytes(), state


def apply_state(model: Any, weights: bytes, state: dict[str, Any], callbacks: KerasCallbacks, scratch: Path) -> None:
    """Load weights and optimizer state into the built model, then RNGs and callback state."""
    file = scratch / WEIGHTS_FILE
    file.write_bytes(weights)
    model.load_weights(str(file))
    restore_rng(model, state["rng"])
    callbacks.load_state(state["callbacks"])


def load_model_weights(model: Any, path: Path, scratch: Path) -> None:
    """A warm start: only the model's weights of checkpoint ``path`` (its layers; not the optimizer, RNGs or
    callback state) into the built model; a model that does not fit raises, naming the first mismatched key."""
    source = path / WEIGHTS_FILE
    if not source.exists():
        raise FileNotFoundError(f"checkpoint folder {path} has no {WEIGHTS_FILE}: it was not written by a "
                                "TFKerasTrial Trainer")
    merged = scratch / WEIGHTS_FILE
    model.save_weights(str(merged))  # the built model's own state: its optimizer part stays as it is
    with h5py.File(source, "r") as saved, h5py.File(merged, "r+") as own:
        _check_fits(_shapes(saved), _shapes(own), path)
        for group in _MODEL_GROUPS:
            if group in own:
                del own[group]
            if group in saved:
                saved.copy(saved[group], own, name=group)
    model.load_weights(str(merged))


def _shapes(file: Any) -> dict[str, tuple[int, ...]]:
    """{dataset path: shape} of the model's groups of a .weights.h5 file, in the file's order."""
    found: dict[str, tuple[int, ...]] = {}

    def visit(name: str, item: Any) -> None:
        if isinstance(item, h5py.Dataset):
            found[name] = tuple(item.shape)

    for group in _MODEL_GROUPS:
        if group in file:
            file[group].visititems(lambda name, item, group=group: visit(f"{group}/{name}", item))
    return found


def _check_fits(saved: dict[str, tuple[int, ...]], own: dict[str, tuple[int, ...]], path: Path) -> None:
    why = first_mismatched_key(saved, own)
    if why is not None:
        raise ValueError(f"checkpoint {path} does not fit the trial's model: first mismatched key {why}. Load it "
                         "into the same model architecture (and hyperparameters) that wrote the checkpoint.")
