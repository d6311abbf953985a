"""``load_model_from_checkpoint_path``: the compiled Keras model of a TFKerasTrial checkpoint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from determined_trials.keras._backend import require_tensorflow_backend
from determined_trials.keras._checkpoint_io import MODEL_FILE, WEIGHTS_FILE

__all__ = ["load_model_from_checkpoint_path"]

keras = require_tensorflow_backend()


def load_model_from_checkpoint_path(path: str | os.PathLike[str], *, compile: bool = True,
                                    custom_objects: dict[str, Any] | None = None) -> Any:
    """The model saved in the checkpoint folder ``path``, compiled (optimizer state included) with its
    trained weights. Custom layers must be registered (``keras.saving.register_keras_serializable``) or
    passed in ``custom_objects``."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a checkpoint folder")
    model_file = folder / MODEL_FILE
    if not model_file.exists():
        hint = (f"it has only {WEIGHTS_FILE}: build the model with your trial's build_model() and call "
                f"model.load_weights('{folder / WEIGHTS_FILE}')") if (folder / WEIGHTS_FILE).exists() else \
            "it was not written by a TFKerasTrial Trainer"
        raise FileNotFoundError(f"checkpoint {folder} has no {MODEL_FILE}; {hint}")
    return keras.models.load_model(str(model_file), compile=compile, custom_objects=custom_objects)
