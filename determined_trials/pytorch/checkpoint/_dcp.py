"""Sharded checkpoints of FSDP2 trials through torch.distributed.checkpoint (DCP): every rank writes its
shard of the models and optimizers (``dcp/``, one ``.distcp`` file a rank, ``.metadata`` from rank 0) and
its own small state (``rank_state/rank<R>.pth``: RNGs, LR schedulers, scalers, callbacks); rank 0 adds
``load_data.json``. Loading reshards: any number of processes (or one plain, unsharded model) reads it.

Models and optimizers are saved under the keys of ``get_state_dict`` on the list of the user's modules:
``model.<i>.<parameter name>`` and ``optim.state.<i>.<parameter name>.<key>``.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from determined_trials.loop import HookRunner
from determined_trials.pytorch.checkpoint._io import (
    LOAD_DATA_FILE,
    capture_rng,
    check_model_fits,
    read_state_file,
    restore_rng,
    tensor_shapes,
    write_load_data,
)
from determined_trials.pytorch.checkpoint._warm_start import (
    hparams_changed,
    optimizer_settings,
    reapply_optimizer_settings,
)
from determined_trials.pytorch.parallel import (
    DCP_DIR,
    is_dcp_checkpoint,
    pending_fsdp_grads,
    plain_module,
    restore_fsdp_grads,
)

if TYPE_CHECKING:
    from determined_trials.pytorch import PyTorchTrial, PyTorchTrialContext

__all__ = [
    "checkpoint_group",
    "load_dcp_models",
    "load_model_weights",
    "load_sharded_state",
    "read_dcp_models",
    "save_sharded_state",
    "start_sharded_save",
]

logger = logging.getLogger("determined_trials.pytorch")

RANK_DIR = "rank_state"


def _container(models: list[torch.nn.Module]) -> torch.nn.ModuleList:
    """The user's modules as one module, so that one optimizer may span several of them."""
    return torch.nn.ModuleList([plain_module(m) for m in models])


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _rank_world() -> tuple[int, int]:
    if _dist_ready():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _dcp_state(context: PyTorchTrialContext) -> dict[str, Any]:
    """The sharded part: models and optimizers (DTensor shards of FSDP2 models, as they are)."""
    model_sd, optim_sd = get_state_dict(_container(context.models), context.optimizers)
    return {"model": model_sd, "optim": optim_sd}


def _rank_state(context: PyTorchTrialContext, hooks: HookRunner) -> dict[str, Any]:
    rank, world = _rank_world()
    return {
        "world_size": world,
        "rank": rank,
        "mesh": list(context._mesh_layout.shape),  # the pending gradients' layout (1-D: [1, world, 1])
        "lr_schedulers_state_dict": [s.state_dict() for s in context.lr_schedulers],
        "scalers_state_dict": [s.state_dict() for s in context.scalers],
        "callbacks": hooks.state_dict(),
        "rng_state": capture_rng(),
        "pending_gradients": pending_fsdp_grads(context),
    }


def _write_small(path: Path, trial: PyTorchTrial, context: PyTorchTrialContext, hooks: HookRunner) -> None:
    rank, _ = _rank_world()
    state = _rank_state(context, hooks)
    hooks.call("on_checkpoint_save_start", state)
    (path / RANK_DIR).mkdir(parents=True, exist_ok=True)
    torch.save(state, path / RANK_DIR / f"rank{rank}.pth")
    if rank == 0:
        write_load_data(path, trial, context, "PyTorchTrial")


def save_sharded_state(path: Path, trial: PyTorchTrial, context: PyTorchTrialContext, hooks: HookRunner) -> None:
    """On every rank: write this rank's shard of the checkpoint into ``path`` now."""
    state = _dcp_state(context)
    _write_small(path, trial, context, hooks)
    dcp.save(state, checkpoint_id=path / DCP_DIR)
    hooks.call("on_checkpoint_end", str(path))
    hooks.call("on_checkpoint_write_end", str(path))


_STAGER: list[Any] = []  # the one stager of this process, once made


def _stager() -> Any:
    """DCP's stager, copying on the calling thread into host buffers it keeps and reuses at the next
    checkpoint (the loop starts a checkpoint only once the previous write is done, so none is in use)."""
    if not _STAGER:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        _STAGER.append(DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                                    use_async_staging=False, use_non_blocking_copy=False)))
    return _STAGER[0]


_GROUP: list[Any] = []  # [default process group, the checkpoint writer's gloo group] once made


def checkpoint_group() -> Any:
    """A gloo group of every rank for background checkpoint writes, made once per default process group
    (``new_group`` is a collective: every rank reaches it at the same checkpoint). Its own group keeps the
    writer thread's collectives from interleaving with training's."""
    default = torch.distributed.distributed_c10d._get_default_group()
    if not _GROUP or _GROUP[0] is not default:  # (a strong reference: no other group takes its address)
        _GROUP[:] = [default, torch.distributed.new_group(backend="gloo", timeout=_collective_timeout())]
    return _GROUP[1]


def _collective_timeout() -> datetime.timedelta:
    """``$DET_COLLECTIVE_TIMEOUT`` (default 1800 s), as for the job's own process group."""
    try:
        seconds = float(os.environ.get("DET_COLLECTIVE_TIMEOUT", "1800"))
    except ValueError:
        seconds = 1800.0
    return datetime.timedelta(seconds=seconds if seconds > 0 else 1800.0)


def start_sharded_save(path: Path, trial: PyTorchTrial, context: PyTorchTrialContext, hooks: HookRunner,
                       process_group: Any, agree: Callable[[bool], bool]) -> concurrent.futures.Future[Any]:
    """On every rank: copy this rank's shard into host memory and write it into ``path`` in the
    background (``dcp.async_save`` over ``process_group``, a group of its own so that its collectives
    never meet training's); the small per-rank state is written now. Returns the write's future.

    ``agree(ok)`` (a collective: whether every rank's ``ok``) runs after the preparation on every rank:
    if any rank failed to prepare, no rank starts the write (whose collectives would wait for the failed
    one), and every rank raises."""
    error: Exception | None = None
    state: dict[str, Any] = {}
    try:
        state = _dcp_state(context)
        _write_small(path, trial, context, hooks)
    except Exception as exc:  # noqa: BLE001 - raised below, after the ranks agreed
        error = exc
    if not agree(error is None):
        if error is not None:
            raise error
        raise RuntimeError("another rank could not prepare its checkpoint shard; no rank wrote this checkpoint")
    future = dcp.async_save(state, checkpoint_id=path / DCP_DIR, process_group=process_group,
                            async_stager=_stager())
    return future  # type: ignore[return-value]  # a Future: the stager copies synchronously


def load_sharded_state(path: Path, context: PyTorchTrialContext, hooks: HookRunner) -> None:
    """Restore models, optimizers, schedulers, scalers, callbacks and RNGs from a DCP checkpoint, on any
    number of processes (DCP reshards). RNGs and pending gradients come back only on the same number of
    processes (each rank its own); other per-rank state comes from the same rank, else rank 0. Written with
    other hyperparameters (a PBT child's start), the optimizers keep the settings ``__init__`` built."""
    rank, world = _rank_world()
    container = _container(context.models)
    built = optimizer_settings(context.optimizers)
    if not is_dcp_checkpoint(path):
        small = _load_plain_checkpoint(path, container, context)
        hooks.call("on_checkpoint_load_start", small)
    else:
        small = _read_rank_state(path, rank)
        hooks.call("on_checkpoint_load_start", small)
        state = _dcp_state(context)
        _dcp_load(state, path)
        set_state_dict(container, context.optimizers, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    _load_list("LR scheduler", small["lr_schedulers_state_dict"], context.lr_schedulers, path)
    if hparams_changed(path / LOAD_DATA_FILE, context.get_hparams()):  # e.g. a PBT child with explored hparams
        reapply_optimizer_settings(context.optimizers, context.lr_schedulers, built)
    _load_list("scaler", small["scalers_state_dict"], context.scalers, path)
    hooks.load_state_dict(small.get("callbacks", {}))
    mesh = list(context._mesh_layout.shape)
    same_layout = small["world_size"] == world and small["rank"] == rank and small.get("mesh", mesh) == mesh
    pending = small.get("pending_gradients") or []
    if pending and not same_layout:
        raise RuntimeError(
            f"checkpoint {path} was written between two optimizer steps of gradient aggregation by "
            f"{small['world_size']} processes; its accumulated gradients are per process and cannot be "
            f"resharded to {world} (mesh {small.get('mesh')} -> {mesh}). Resume it on the same processes and mesh "
            "(or from a checkpoint taken on an optimizer step)"
        )
    restore_fsdp_grads(pending, context)
    if same_layout:
        restore_rng(small["rng_state"])
    else:
        logger.info("checkpoint %s was written by %d process(es), resumed on %d: the data order goes on, "
                    "the RNGs stay as seeded", path, small["world_size"], world)


def _load_plain_checkpoint(path: Path, container: torch.nn.Module, context: PyTorchTrialContext) -> dict[str, Any]:
    """A checkpoint of an unsharded trial (``state_dict.pth``, e.g. from one process) into FSDP2 models:
    its full weights and optimizer state are sharded on load. Returns its per-rank part (as one process's)."""
    checkpoint = read_state_file(path)
    models = checkpoint["models_state_dict"]
    if len(models) != len(context.models):
        raise RuntimeError(
            f"checkpoint {path} holds {len(models)} model(s) but the trial wrapped {len(context.models)}"
        )
    full = {f"{i}.{key}": value for i, state in enumerate(models) for key, value in state.items()}
    names = {id(p): name for name, p in container.named_parameters()}
    optim: dict[str, Any] = {"state": {}, "param_groups": []}
    saved_optims = checkpoint["optimizers_state_dict"]
    _load_list("optimizer", saved_optims, context.optimizers, path, load=False)
    for optimizer, saved in zip(context.optimizers, saved_optims):
        order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        optim["state"].update({order[int(i)]: st for i, st in saved["state"].items()})
        optim["param_groups"] += [{**g, "params": [order[int(i)] for i in g["params"]]} for g in saved["param_groups"]]
    set_state_dict(container, context.optimizers, model_state_dict=full, optim_state_dict=optim,
                   options=StateDictOptions(full_state_dict=True))
    return {
        "world_size": 1, "rank": 0, "rng_state": checkpoint["rng_state"],
        "lr_schedulers_state_dict": checkpoint["lr_schedulers_state_dict"],
        "scalers_state_dict": checkpoint.get("scalers_state_dict", []), "callbacks": checkpoint.get("callbacks", {}),
        "pending_gradients": checkpoint.get("pending_gradients", []),
    }


def _dcp_load(state: dict[str, Any], path: Path) -> None:
    """``dcp.load`` in place: collectively under torch.distributed, else in this process alone (quietly)."""
    if _dist_ready():
        dcp.load(state, checkpoint_id=path / DCP_DIR)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=path / DCP_DIR, no_dist=True)


def _read_rank_state(path: Path, rank: int) -> dict[str, Any]:
    own = path / RANK_DIR / f"rank{rank}.pth"
    file = own if own.exists() else path / RANK_DIR / "rank0.pth"
    if not file.exists():
        raise FileNotFoundError(f"{path} has no {RANK_DIR}/rank0.pth: it is not a complete FSDP2 checkpoint")
    state: dict[str, Any] = torch.load(file, map_location="cpu", weights_only=True)
    return state


def _load_list(kind: str, saved: list[Any], objects: list[Any], path: Path, *, load: bool = True) -> None:
    if len(saved) != len(objects):
        raise RuntimeError(
            f"checkpoint {path} holds {len(saved)} {kind} state(s) but the trial wrapped {len(objects)}; "
            f"wrap the same {kind}s, in the same order, as the trial that wrote it"
        )
    for obj, state in zip(objects, saved if load else []):
        obj.load_state_dict(state)


def load_dcp_models(path: Path, models: list[torch.nn.Module]) -> None:
    """Load only the models' weights of a DCP checkpoint into ``models`` (sharded or plain; one process
    without torch.distributed is fine)."""
    container = _container(models)
    state = {"model": get_model_state_dict(container)}
    _dcp_load(state, path)
    set_model_state_dict(container, state["model"])


def load_model_weights(path: Path, models: list[torch.nn.Module]) -> None:
    """A warm start of FSDP2 models, or from a DCP checkpoint: only the models' weights (a DCP checkpoint is
    resharded, a plain ``state_dict.pth`` sharded on load); one that does not fit names the first mismatched key."""
    if is_dcp_checkpoint(path):
        shapes = _dcp_model_shapes(path)
        _load_list("model", list(shapes.values()), models, path, load=False)
        for index, model in enumerate(models):
            check_model_fits(shapes[index], plain_module(model), index, path)
        load_dcp_models(path, models)
        return
    saved = read_state_file(path)["models_state_dict"]
    _load_list("model", saved, models, path, load=False)
    for index, (model, state) in enumerate(zip(models, saved)):
        check_model_fits(tensor_shapes(state), plain_module(model), index, path)
    full = {f"{i}.{key}": value for i, state in enumerate(saved) for key, value in state.items()}
    set_model_state_dict(_container(models), full, options=StateDictOptions(full_state_dict=True))


def _dcp_model_shapes(path: Path) -> dict[int, dict[str, tuple[int, ...] | None]]:
    """{model index: {key: shape}} of a DCP checkpoint's models, read from its metadata (no tensor is read)."""
    metadata = dcp.FileSystemReader(str(path / DCP_DIR)).read_metadata().state_dict_metadata
    shapes: dict[int, dict[str, tuple[int, ...] | None]] = {}
    for flat, item in metadata.items():
        group, _, rest = flat.partition(".")
        index, _, key = rest.partition(".")
        if group == "model" and index.isdigit():
            size = getattr(item, "size", None)
            shapes.setdefault(int(index), {})[key] = None if size is None else tuple(size)
    return {i: shapes[i] for i in sorted(shapes)}


def read_dcp_models(path: Path) -> list[dict[str, torch.Tensor]]:
    """The models of a DCP checkpoint as plain, unsharded state dicts (one a model), read in this
    process alone (no torch.distributed)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        loaded = _load_state_dict_from_keys(keys={"model"}, checkpoint_id=str(path / DCP_DIR))
    flat: dict[str, Any] = loaded["model"]
    models: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in flat.items():
        index, _, name = key.partition(".")
        models.setdefault(int(index), {})[name] = value
    return [models[i] for i in sorted(models)]
