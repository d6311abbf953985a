"""What a PyTorchTrial checkpoint holds and how it is written and read back.

``state_dict.pth`` holds models, optimizers, LR schedulers, scalers, callbacks and every RNG, all
as tensors and plain values so it loads with ``torch.load(weights_only=True)``; ``load_data.json``
names the trial class, hyperparameters and config so ``load_trial_from_checkpoint_path`` can
rebuild the trial. The file is always read into host memory: RNG states must stay there, and
``load_state_dict`` copies weights and optimizer state to wherever the model lives, so a checkpoint
written on a GPU resumes on a CPU-only machine and the other way round.
"""

from __future__ import annotations

import itertools
import json
import logging
import pickle
import random
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.utils.serialization  # noqa: F401 - torch.save imports it on first use: not in the first checkpoint

from determined_trials.loop import HookRunner, first_mismatched_key
from determined_trials.pytorch.checkpoint._snapshot import copy_to_host, wait_copied
from determined_trials.pytorch.checkpoint._warm_start import (
    hparams_changed,
    optimizer_settings,
    reapply_optimizer_settings,
)
from determined_trials.pytorch.parallel import plain_module, plain_state_dict

if TYPE_CHECKING:
    from determined_trials._trial_context import TrialContext
    from determined_trials.pytorch import PyTorchTrial, PyTorchTrialContext

__all__ = [
    "LOAD_DATA_FILE",
    "STATE_FILE",
    "capture_rng",
    "check_model_fits",
    "large_state_template",
    "load_trial_state",
    "own_rng_state",
    "restore_cuda_rng",
    "restore_rng",
    "save_trial_state",
    "snapshot_trial_state",
    "tensor_shapes",
    "write_load_data",
    "write_trial_state",
]

logger = logging.getLogger("determined_trials.pytorch")

STATE_FILE = "state_dict.pth"
LOAD_DATA_FILE = "load_data.json"


def capture_rng() -> dict[str, Any]:
    """Python, numpy, torch CPU and CUDA RNG states as tensors and plain values."""
    version, words, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "random_rng_state": {"version": version, "words": torch.from_numpy(np.array(words, dtype=np.int64)),
                             "gauss": gauss},
        "np_rng_state": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "cpu_rng_state": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["gpu_rng_states"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what ``capture_rng`` returned; its tensors may be on any device (they are read back
    on the host first). CUDA RNG states are restored on every device when this machine has as many
    GPUs as the one that saved them, else on the devices both have (with a warning)."""
    py = state["random_rng_state"]
    random.setstate((int(py["version"]), tuple(int(w) for w in _host(py["words"]).tolist()), py["gauss"]))
    npy = state["np_rng_state"]
    np.random.set_state({
        "bit_generator": "MT19937",
        "state": {"key": _host(npy["key"]).numpy().astype(np.uint32), "pos": int(npy["pos"])},
        "has_gauss": int(npy["has_gauss"]),
        "gauss": float(npy["gauss"]),
    })
    torch.set_rng_state(_host(state["cpu_rng_state"]))
    saved_cuda = state.get("gpu_rng_states")
    if saved_cuda and torch.cuda.is_available():
        restore_cuda_rng([_host(s) for s in saved_cuda])


def restore_cuda_rng(states: list[torch.Tensor]) -> None:
    """Set every CUDA device's RNG state from ``states`` (host ByteTensors, one per device saved)."""
    count = torch.cuda.device_count()
    if len(states) == count:
        torch.cuda.set_rng_state_all(states)
        return
    logger.warning(
        "the checkpoint holds CUDA RNG states of %d device(s) but this machine has %d; restored on the "
        "first %d only, so random numbers drawn on the others differ from an uninterrupted run",
        len(states), count, min(len(states), count),
    )
    for index, rng in enumerate(states[:count]):
        torch.cuda.set_rng_state(rng, index)


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in host memory (RNG states are read there; a copy only when it is elsewhere)."""
    return tensor if tensor.device.type == "cpu" else tensor.cpu()


def build_state_dict(context: PyTorchTrialContext, hooks: HookRunner,
                     rank_rngs: list[Any] | None = None) -> dict[str, Any]:
    """Everything resumable of a trial, as one dict; models under the keys of the user's modules
    (no DDP ``module.`` or ``torch.compile`` ``_orig_mod.`` prefix). ``rank_rngs``: every rank's
    ``capture_rng()`` in rank order (several ranks), saved as ``rank_rng_states``."""
    state = {
        **large_state_template(context),
        "lr_schedulers_state_dict": [s.state_dict() for s in context.lr_schedulers],
        "scalers_state_dict": [s.state_dict() for s in context.scalers],
        "callbacks": hooks.state_dict(),
        "rng_state": capture_rng(),
        "pending_gradients": _pending_gradients(context),
    }
    if rank_rngs is not None:
        state["rank_rng_states"] = rank_rngs
    return state


def own_rng_state(checkpoint: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """The RNG state this rank resumes with: its own when the checkpoint holds every rank's and was written
    by as many ranks (the ranks' RNGs drift apart when they draw different amounts, e.g. dropout over
    batches of different sizes), else the chief's."""
    ranks = checkpoint.get("rank_rng_states")
    if isinstance(ranks, list) and len(ranks) == world_size:
        return ranks[rank]
    return checkpoint["rng_state"]


def large_state_template(context: PyTorchTrialContext) -> dict[str, Any]:
    """The models' and optimizers' part of ``build_state_dict`` (nearly all of a checkpoint's bytes), in
    the same structure: what the host buffers of background checkpoints are prepared from."""
    return {
        "models_state_dict": [plain_module(m).state_dict() for m in context.models],
        "optimizers_state_dict": [o.state_dict() for o in context.optimizers],
    }


def _pending_gradients(context: PyTorchTrialContext) -> list[list[torch.Tensor | None]]:
    """Gradients accumulated since the last optimizer step (aggregation_frequency > 1), per model.

    A stop between two optimizer steps must not lose them, or the resumed run would differ.
    """
    if context._aggregation_frequency == 1:
        return []
    return [[None if p.grad is None else p.grad.detach().clone() for p in plain_module(m).parameters()]
            for m in context.models]


def _restore_pending_gradients(saved: list[list[torch.Tensor | None]], models: list[torch.nn.Module]) -> None:
    for model, grads in zip(models, saved):
        for param, grad in zip(plain_module(model).parameters(), grads):
            param.grad = None if grad is None else grad.to(param.device)


def state_nbytes(context: PyTorchTrialContext) -> int:
    """Bytes of the tensors a checkpoint holds: models' parameters and buffers, optimizer state."""
    total = 0
    for model in context.models:
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            total += tensor.numel() * tensor.element_size()
    for optimizer in context.optimizers:
        for param_state in optimizer.state.values():
            for value in param_state.values():
                if isinstance(value, torch.Tensor):
                    total += value.numel() * value.element_size()
    return total


def snapshot_trial_state(trial: PyTorchTrial, context: PyTorchTrialContext, hooks: HookRunner,
                         *, copy: bool, reuse: Any = None, rank_rngs: list[Any] | None = None) -> dict[str, Any]:
    """What ``write_trial_state`` writes; with ``copy`` every tensor is a host-memory copy, so training
    may go on mutating the models while a background writer serialises it (``reuse``: a finished
    snapshot's state, or prepared buffers, whose tensors may be overwritten). On CUDA the copies are
    queued on a side stream; ``write_trial_state`` waits for them."""
    checkpoint = build_state_dict(context, hooks, rank_rngs)
    hooks.call("on_checkpoint_save_start", checkpoint)
    state, ready = copy_to_host(checkpoint, reuse, context.device) if copy else (checkpoint, None)
    return {"state": state, "ready": ready, "load_data": _load_data_json(trial, context, "PyTorchTrial")}


def write_trial_state(snapshot: dict[str, Any], path: Path) -> None:
    """Write ``state_dict.pth`` and ``load_data.json`` into ``path`` (once a snapshot's copies are done)."""
    wait_copied(snapshot.get("ready"))
    torch.save(snapshot["state"], path / STATE_FILE)
    (path / LOAD_DATA_FILE).write_text(snapshot["load_data"])


def save_trial_state(path: Path, trial: PyTorchTrial, context: PyTorchTrialContext, hooks: HookRunner,
                     snapshot: dict[str, Any] | None = None, rank_rngs: list[Any] | None = None) -> None:
    """Write ``state_dict.pth`` and ``load_data.json`` into ``path`` now (chief only): ``snapshot``, or
    the live state when None (with ``rank_rngs``, see ``build_state_dict``)."""
    if snapshot is None:
        snapshot = snapshot_trial_state(trial, context, hooks, copy=False, rank_rngs=rank_rngs)
    write_trial_state(snapshot, path)
    hooks.call("on_checkpoint_end", str(path))
    hooks.call("on_checkpoint_write_end", str(path))


def write_load_data(path: Path, trial: Any, context: TrialContext, trial_type: str) -> None:
    """Write ``load_data.json``: the trial type and class, hyperparameters and experiment config."""
    (path / LOAD_DATA_FILE).write_text(_load_data_json(trial, context, trial_type))


def _load_data_json(trial: Any, context: TrialContext, trial_type: str) -> str:
    """The text of ``load_data.json``; made once per trial and context (the config and hyperparameters
    do not change during a run), then reused by every checkpoint."""
    key = (type(trial), trial_type)
    if key not in context._load_data_text:
        context._load_data_text[key] = _render_load_data(trial, context, trial_type)
    return context._load_data_text[key]


def _render_load_data(trial: Any, context: TrialContext, trial_type: str) -> str:
    load_data = {
        "trial_type": trial_type,
        "trial_cls_spec": f"{type(trial).__module__}:{type(trial).__qualname__}",
        "hparams": context.get_hparams(),
        "experiment_config": context.get_experiment_config(),
    }
    return json.dumps(load_data, indent=1)


def read_state_file(path: Path, *, weights_only: bool = True) -> dict[str, Any]:
    """Load ``state_dict.pth`` into host memory, safely (weights_only, unless the caller opted out), with
    clear errors when it is missing or holds pickled objects (e.g. a Determined 0.38 checkpoint's numpy
    RNG state). Whatever device wrote a tensor, it is read to the CPU: ``load_state_dict`` then copies
    weights and optimizer state to the model's device, and RNG states never leave the host."""
    state_file = path / STATE_FILE
    if not state_file.exists():
        raise FileNotFoundError(f"{path} has no {STATE_FILE}: it is not a PyTorchTrial checkpoint")
    try:
        loaded: dict[str, Any] = torch.load(state_file, map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError as err:
        if not weights_only:
            raise
        raise pickle.UnpicklingError(
            f"{state_file} holds pickled Python objects (Determined 0.38 checkpoints pickle numpy RNG "
            "state), which a safe load (weights_only=True) refuses. Unpickling runs code from the file: "
            "only if you trust it, opt in with load_trial_from_checkpoint_path(path, "
            f"torch_load_kwargs={{'weights_only': False}}). ({err})"
        ) from None
    return loaded


def load_trial_state(path: Path, context: PyTorchTrialContext, hooks: HookRunner) -> None:
    """Restore models, optimizers, schedulers, scalers, callbacks and RNGs from ``path``; written with other
    hyperparameters (a PBT child's start), the optimizers keep the settings ``__init__`` built (``_warm_start``)."""
    checkpoint = read_state_file(path)
    hooks.call("on_checkpoint_load_start", checkpoint)
    load_models(checkpoint, context.models, path)
    built = optimizer_settings(context.optimizers)
    _load_list("optimizer", checkpoint["optimizers_state_dict"], context.optimizers, path)
    _load_list("LR scheduler", checkpoint["lr_schedulers_state_dict"], context.lr_schedulers, path)
    if hparams_changed(path / LOAD_DATA_FILE, context.get_hparams()):  # e.g. a PBT child with explored hparams
        reapply_optimizer_settings(context.optimizers, context.lr_schedulers, built)
    _load_list("scaler", checkpoint.get("scalers_state_dict", []), context.scalers, path)
    hooks.load_state_dict(checkpoint.get("callbacks", {}))
    _restore_pending_gradients(checkpoint.get("pending_gradients", []), context.models)
    restore_rng(own_rng_state(checkpoint, context.distributed.get_rank(), context.distributed.get_size()))


def load_models(checkpoint: dict[str, Any], models: list[torch.nn.Module], path: Path) -> None:
    """Load every wrapped model's weights into the user's module (compiled or not; a compiled wrapper's
    ``_orig_mod.`` keys of older checkpoints are read as plain keys); a mismatch says which model and why."""
    saved = checkpoint.get("models_state_dict")
    if saved is None and "model_state_dict" in checkpoint:  # the single-model key of old checkpoints
        saved = [checkpoint["model_state_dict"]]
    if saved is None:
        raise RuntimeError(f"checkpoint {path}: {STATE_FILE} holds no models_state_dict (keys: {sorted(checkpoint)})")
    _check_count("model", saved, models, path)
    for index, (model, state) in enumerate(zip(models, saved)):
        module = plain_module(model)
        state = plain_state_dict(state, module)
        try:
            module.load_state_dict(state)
        except RuntimeError as err:
            check_model_fits(tensor_shapes(state), module, index, path)  # names the first mismatched key
            raise RuntimeError(
                f"checkpoint {path} does not fit model {index} ({type(plain_module(model)).__name__}): {err}\n"
                "Resume into the same model architecture (and hyperparameters) that wrote the checkpoint."
            ) from None


def tensor_shapes(state: Mapping[str, Any]) -> dict[str, tuple[int, ...] | None]:
    """Each key of a state dict and its tensor's shape (a sharded DTensor's global one; None: not a tensor)."""
    return {key: tuple(value.shape) if isinstance(value, torch.Tensor) else None for key, value in state.items()}


def check_model_fits(saved: Mapping[str, tuple[int, ...] | None], module: torch.nn.Module, index: int,
                     path: Path) -> None:
    """Raise, naming the first mismatched key, when a checkpoint's model (``saved``: key -> shape) does not
    fit ``module``: in the module's order, a key the checkpoint lacks or holds in another shape, then a key
    the module lacks."""
    why = first_mismatched_key(saved, tensor_shapes(module.state_dict()))
    if why is not None:
        raise RuntimeError(
            f"checkpoint {path} does not fit model {index} ({type(module).__name__}): first mismatched key {why}.\n"
            "Load it into the same model architecture (and hyperparameters) that wrote the checkpoint."
        )


def _load_list(kind: str, saved: list[Any], objects: list[Any], path: Path) -> None:
    _check_count(kind, saved, objects, path)
    for obj, state in zip(objects, saved):
        try:
            obj.load_state_dict(state)
        except (ValueError, KeyError, RuntimeError) as err:
            raise RuntimeError(f"checkpoint {path}: cannot restore a {kind}: {err}") from None


def _check_count(kind: str, saved: list[Any], objects: list[Any], path: Path) -> None:
    if len(saved) != len(objects):
        raise RuntimeError(
            f"checkpoint {path} holds {len(saved)} {kind} state(s) but the trial wrapped {len(objects)}; "
            f"wrap the same {kind}s, in the same order, as the trial that wrote it"
        )
