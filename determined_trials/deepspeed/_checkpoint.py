"""What a DeepSpeedTrial checkpoint holds besides the engines' own files: per rank, the callbacks'
state and every RNG (``det_state_rank<R>.pth``); on the chief, ``load_data.json``. And turning a
checkpoint into one plain ``state_dict`` for inference."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from determined_trials.deepspeed._reshard import saved_world_size, universal_view
from determined_trials.loop import HookRunner
from determined_trials.pytorch.checkpoint import (
    capture_rng,
    check_model_fits,
    restore_rng,
    tensor_shapes,
    write_load_data,
)

if TYPE_CHECKING:
    from determined_trials.deepspeed._context import DeepSpeedTrialContext
    from determined_trials.deepspeed._trial import DeepSpeedTrial

__all__ = ["consolidate_checkpoint", "load_engine_weights", "load_rank_state", "rank_state_file", "save_rank_state"]

logger = logging.getLogger("determined_trials.deepspeed")
_LAYOUT = "det_layout"  # the writer's number of ranks and global batch size, beside the callbacks' state


def rank_state_file(path: Path, rank: int) -> Path:
    """Where ``rank`` keeps its harness state in a checkpoint folder."""
    return path / f"det_state_rank{rank}.pth"


def save_rank_state(path: Path, trial: DeepSpeedTrial, context: DeepSpeedTrialContext, hooks: HookRunner) -> None:
    """On every rank: the harness state file, ``load_data.json`` (chief), then ``trial.save``."""
    rank = context.distributed.get_rank()
    state = {"callbacks": hooks.state_dict(), "rng_state": capture_rng()}
    hooks.call("on_checkpoint_save_start", state)
    layout = {"world_size": context.distributed.get_size(), "train_batch_size": _train_batch_size(context)}
    torch.save({**state, _LAYOUT: layout}, rank_state_file(path, rank))
    if rank == 0:
        write_load_data(path, trial, context, "DeepSpeedTrial")
    trial.save(context, path)
    hooks.call("on_checkpoint_end", str(path))
    hooks.call("on_checkpoint_write_end", str(path))


def load_rank_state(path: Path, trial: DeepSpeedTrial, context: DeepSpeedTrialContext, hooks: HookRunner) -> None:
    """On every rank: ``trial.load`` (the engines), then this rank's callbacks and RNGs.

    A checkpoint of another number of ranks is resumed through DeepSpeed's universal checkpoint format
    (``trial.load`` gets a converted view of it); callbacks then come from the same rank, else rank 0, and
    the RNGs stay as seeded (they are per rank)."""
    rank, world = context.distributed.get_rank(), context.distributed.get_size()
    saved_world = saved_world_size(path)
    file = rank_state_file(path, rank if rank < saved_world else 0)
    state: dict[str, Any] = torch.load(file, map_location="cpu", weights_only=True)
    _check_same_global_batch(path, state.pop(_LAYOUT, {}), context, saved_world)  # callbacks never see it
    hooks.call("on_checkpoint_load_start", state)
    if saved_world == world:
        trial.load(context, path)
    else:
        with universal_view(path, context) as view:
            trial.load(context, view)
    hooks.load_state_dict(state.get("callbacks", {}))
    if saved_world == world:
        restore_rng(state["rng_state"])
    else:
        logger.info("checkpoint %s was written by %d rank(s), resumed on %d: the engines were resharded through "
                    "DeepSpeed's universal checkpoint, the data order goes on, the RNGs stay as seeded",
                    path, saved_world, world)


def _train_batch_size(context: DeepSpeedTrialContext) -> int | None:
    return int(context.models[0].train_batch_size()) if context.models else None


def _check_same_global_batch(path: Path, layout: dict[str, Any], context: DeepSpeedTrialContext,
                             saved_world: int) -> None:
    """The data position counts batches of the checkpoint's global batch size: it must not change."""
    saved, now = layout.get("train_batch_size"), _train_batch_size(context)
    if saved is None or now is None or saved == now:
        return
    world = context.distributed.get_size()
    raise RuntimeError(
        f"checkpoint {path} was written with a global batch of {saved} records (train_batch_size, on "
        f"{saved_world} rank(s)) but this job's engine has train_batch_size {now} on {world} rank(s): the data "
        f"position is counted in batches of {saved}, so keep train_batch_size {saved} and change "
        "train_micro_batch_size_per_gpu or gradient_accumulation_steps instead (train_batch_size = micro-batch x "
        f"gradient_accumulation_steps x {world} ranks)"
    )


def load_engine_weights(path: Path, context: DeepSpeedTrialContext) -> None:
    """A warm start, on every rank: each engine's module weights from ``path`` (DeepSpeed's
    ``load_module_only``), not its optimizer or LR scheduler, nor the callbacks' state and RNGs (``trial.load``
    is not called); a module that does not fit raises, naming the first mismatched key."""
    for index, engine in enumerate(context.models):
        tag = f"model{index}"
        if not (path / tag).is_dir():
            raise RuntimeError(f"checkpoint {path} has no engine checkpoint {tag!r}: start from a checkpoint of a "
                               "DeepSpeedTrial that wrapped as many engines")
        try:
            engine.load_checkpoint(str(path), tag=tag, load_module_only=True, load_optimizer_states=False,
                                   load_lr_scheduler_states=False)
        except RuntimeError:
            check_model_fits(tensor_shapes(consolidate_checkpoint(path, tag)), engine.module, index, path)
            raise


def consolidate_checkpoint(path: str | os.PathLike[str], tag: str = "model0") -> dict[str, torch.Tensor]:
    """One plain fp32 ``state_dict`` of engine ``tag`` from a DeepSpeedTrial checkpoint folder (ZeRO 0,
    1, 2 or 3, any number of ranks), e.g. for ``model.load_state_dict`` in inference code.

    ZeRO 1/2/3 partitions are merged with DeepSpeed's own ``zero_to_fp32`` (the fp32 master weights; under
    ZeRO-3 they equal the gathered parameters); stage 0 checkpoints already hold the whole module.
    """
    folder = Path(path)
    engine_dir = folder / tag
    if not engine_dir.is_dir():
        found = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        raise FileNotFoundError(f"{folder} has no engine checkpoint {tag!r} (found: {found or 'none'})")
    if any(engine_dir.glob("*optim_states.pt")) and any(engine_dir.glob("zero_pp_rank_*")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state: dict[str, torch.Tensor] = get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=tag)
        return state
    model_files = sorted(engine_dir.glob("mp_rank_*_model_states.pt"))
    if len(model_files) != 1:
        raise ValueError(f"{engine_dir} holds {len(model_files)} model-state files; only data-parallel "
                         "(non-pipeline) checkpoints can be consolidated")
    saved = torch.load(model_files[0], map_location="cpu", weights_only=False)
    return {key: value.float() if value.is_floating_point() else value for key, value in saved["module"].items()}
