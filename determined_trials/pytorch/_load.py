"""``load_trial_from_checkpoint_path``: rebuild a trial with its trained weights for inference."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from determined_trials.pytorch._checkpoint_io import LOAD_DATA_FILE, load_models, read_state_file
from determined_trials.pytorch._context import PyTorchTrialContext
from determined_trials.pytorch._trial import PyTorchTrial

__all__ = ["load_trial_from_checkpoint_path"]


def load_trial_from_checkpoint_path(
    path: str | os.PathLike[str],
    trial_class: type[PyTorchTrial] | None = None,
    trial_kwargs: Mapping[str, Any] | None = None,
    torch_load_kwargs: Mapping[str, Any] | None = None,
) -> PyTorchTrial:
    """The trial of a checkpoint folder, built with its hparams and config, with trained weights.

    ``trial_class`` defaults to the class named in the checkpoint (it must be importable);
    ``trial_kwargs`` are passed to its constructor after the context. Only model weights are
    loaded (not optimizers), on the CPU unless ``torch_load_kwargs={"map_location": ...}``.
    """
    folder = Path(path)
    load_data = _read_load_data(folder)
    cls = trial_class or _import_trial_class(load_data["trial_cls_spec"])
    context = PyTorchTrialContext(
        config=load_data.get("experiment_config"), hparams=load_data.get("hparams") or {},
        device=(torch_load_kwargs or {}).get("map_location", "cpu"),
    )
    trial = cls(context, **dict(trial_kwargs or {}))
    checkpoint = read_state_file(folder, context.device)
    load_models(checkpoint, context.models, folder)
    return trial


def _read_load_data(folder: Path) -> dict[str, Any]:
    file = folder / LOAD_DATA_FILE
    if not file.exists():
        raise FileNotFoundError(
            f"{folder} has no {LOAD_DATA_FILE}: pass the folder of a checkpoint written by a "
            "det.pytorch Trainer (e.g. from checkpoint.restore_path(uuid) or the run folder's checkpoints/)"
        )
    loaded: dict[str, Any] = json.loads(file.read_text())
    return loaded


def _import_trial_class(spec: str) -> type[PyTorchTrial]:
    module_name, _, qualname = spec.partition(":")
    if module_name == "__main__":
        raise ValueError(
            f"the checkpoint's trial class {spec!r} was defined in a script's __main__ and cannot be "
            "imported; pass trial_class=YourTrial"
        )
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import the checkpoint's trial class {spec!r} ({err}); pass trial_class=...") from err
    if not (isinstance(obj, type) and issubclass(obj, PyTorchTrial)):
        raise TypeError(f"{spec!r} is not a PyTorchTrial subclass")
    return obj
