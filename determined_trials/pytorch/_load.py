"""``load_trial_from_checkpoint_path``: rebuild a trial with its trained weights for inference or a
warm start, from our checkpoints and (with an explicit opt-in to unpickling) Determined 0.38's; and
``CheckpointLoadContext``, the context it builds the trial with (for trials with extra arguments)."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from determined_trials._compat import import_from_path, import_qualname
from determined_trials.config import ConfigWarning, ExperimentConfig, load_config
from determined_trials.core import read_json_file
from determined_trials.errors import ConfigError
from determined_trials.pytorch._context import PyTorchTrialContext
from determined_trials.pytorch._trial import PyTorchTrial
from determined_trials.pytorch.checkpoint import LOAD_DATA_FILE, load_models, read_state_file
from determined_trials.pytorch.parallel import is_dcp_checkpoint

__all__ = ["CheckpointLoadContext", "load_trial_from_checkpoint_path"]

logger = logging.getLogger("determined_trials.pytorch")

_CODE_DIR = "code"
_SEARCHER = {"name": "single", "metric": "validation_loss"}


class CheckpointLoadContext(PyTorchTrialContext):
    """A ``PyTorchTrialContext`` for building a trial outside training, e.g. to load a checkpoint's
    weights into it (as in Determined): one process, trial seed 0, no Core API context (metrics and
    checkpoints go nowhere). ``exp_conf`` is the recorded config (``load_data.json``'s); one that does
    not validate here, or has no searcher, is read for what it can give. Use ``det.pytorch.init()`` to
    train. ``device`` (a local addition) defaults to the default device (a GPU where there is one).

    ``trial = MyTrial(det.pytorch.CheckpointLoadContext(hparams, exp_conf), extra_arg)``
    """

    def __init__(self, hparams: Mapping[str, Any] | None = None, exp_conf: Mapping[str, Any] | None = None,
                 *, device: Any = None) -> None:
        given = dict(hparams or {})
        config = _recorded_config(exp_conf, given)
        super().__init__(config=config, hparams=given, trial_seed=0, device=device)


def load_trial_from_checkpoint_path(
    path: str | os.PathLike[str],
    trial_class: type[PyTorchTrial] | None = None,
    trial_kwargs: Mapping[str, Any] | None = None,
    torch_load_kwargs: Mapping[str, Any] | None = None,
) -> PyTorchTrial:
    """The trial of a checkpoint folder, built with its hparams and config, with trained weights.

    ``trial_class`` defaults to the class named in the checkpoint (imported as is, else from its
    ``code/`` folder); ``trial_kwargs`` go to its constructor after the context. Only model weights
    are loaded (not optimizers), into a model on the CPU unless ``torch_load_kwargs={"map_location": ...}``
    names its device (the file itself is always read into host memory first).
    An FSDP2 trial's checkpoint (DCP shards) loads into the trial built here, in one process without
    torch.distributed: build the model unsharded when torch.distributed is not initialised.
    The load is ``weights_only`` unless ``torch_load_kwargs={"weights_only": False}``: Determined 0.38
    checkpoints pickle numpy RNG state, so they need that opt-in (only for files you trust).
    """
    folder = Path(path)
    load_data = _read_load_data(folder)
    if load_data.get("trial_type", "PyTorchTrial") != "PyTorchTrial":
        logger.warning("checkpoint %s was written by a %s, not a PyTorchTrial", folder, load_data.get("trial_type"))
    load_kwargs = dict(torch_load_kwargs or {})
    device = load_kwargs.pop("map_location", "cpu")
    weights_only = load_kwargs.pop("weights_only", True)
    if load_kwargs:
        raise TypeError(
            f"torch_load_kwargs: only map_location and weights_only are supported, got {sorted(load_kwargs)}"
        )
    if not isinstance(weights_only, bool):
        raise TypeError(f"torch_load_kwargs['weights_only'] must be True or False, got {weights_only!r}")
    cls = trial_class or _import_trial_class(load_data["trial_cls_spec"], folder / _CODE_DIR)
    hparams = load_data.get("hparams") or {}
    context = CheckpointLoadContext(hparams, load_data.get("experiment_config"), device=device)
    trial = cls(context, **dict(trial_kwargs or {}))
    if is_dcp_checkpoint(folder):  # an FSDP2 trial's shards, read into this process's (unsharded) models
        from determined_trials.pytorch.checkpoint import load_dcp_models

        load_dcp_models(folder, context.models)
        return trial
    checkpoint = read_state_file(folder, weights_only=weights_only)
    load_models(checkpoint, context.models, folder)
    return trial


def _recorded_config(recorded: Any, hparams: Mapping[str, Any]) -> ExperimentConfig:
    """The checkpoint's config; Determined writes null when ``exp_conf`` was not given, and a full
    cluster config otherwise (its cluster-only keys are dropped quietly: it is a record, not a request)."""
    raw = dict(recorded) if isinstance(recorded, Mapping) else {"hyperparameters": dict(hparams)}
    if not raw.get("searcher"):
        raw["searcher"] = _SEARCHER
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        try:
            return load_config(raw)
        except ConfigError as err:
            logger.warning("the checkpoint's experiment config does not validate here (%s); using its "
                           "hyperparameters only", str(err).splitlines()[0])
            return load_config({"hyperparameters": dict(hparams), "searcher": _SEARCHER})


def _read_load_data(folder: Path) -> dict[str, Any]:
    return read_json_file(folder / LOAD_DATA_FILE, (
        f"{folder} has no {LOAD_DATA_FILE}: pass the folder of a checkpoint written by a "
        "det.pytorch Trainer (e.g. from checkpoint.restore_path(uuid) or the run folder's checkpoints/)"
    ))


def _import_trial_class(spec: str, code_dir: Path) -> type[PyTorchTrial]:
    module_name, _, qualname = spec.partition(":")
    if module_name == "__main__":
        raise ValueError(
            f"the checkpoint's trial class {spec!r} was defined in a script's __main__ and cannot be "
            "imported; pass trial_class=YourTrial"
        )
    try:
        obj = import_qualname(module_name, qualname)
    except (ImportError, AttributeError) as err:
        if not code_dir.is_dir():
            raise ValueError(
                f"cannot import the checkpoint's trial class {spec!r} ({err}); pass trial_class=..."
            ) from err
        try:
            with import_from_path(code_dir):
                obj = import_qualname(module_name, qualname)
        except (ImportError, AttributeError) as err2:
            raise ValueError(f"cannot import the checkpoint's trial class {spec!r}, not even from {code_dir} "
                             f"({err2}); pass trial_class=...") from err2
    if not (isinstance(obj, type) and issubclass(obj, PyTorchTrial)):
        raise TypeError(f"{spec!r} is not a PyTorchTrial subclass")
    return obj
