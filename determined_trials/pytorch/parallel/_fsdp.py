"""FSDP2 models (``torch.distributed.fsdp.fully_shard``): recognising them, the checks made when one is
wrapped (no DDP around it, no mix with DDP models), and turning their gradient sync off on the batches
that only accumulate."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "DCP_DIR",
    "check_fsdp_model",
    "check_model_mix",
    "fsdp_class",
    "is_dcp_checkpoint",
    "is_fsdp",
    "set_fsdp_grad_sync",
]

DCP_DIR = "dcp"  # the folder of a checkpoint that holds its DCP (torch.distributed.checkpoint) files


def is_dcp_checkpoint(path: Path) -> bool:
    """Whether the checkpoint folder ``path`` holds a DCP checkpoint (written by an FSDP2 trial)."""
    return (path / DCP_DIR / ".metadata").exists()


def fsdp_class() -> type | None:
    """``torch.distributed.fsdp.FSDPModule`` when FSDP2 was ever imported (nothing is imported for it)."""
    module = sys.modules.get("torch.distributed.fsdp")
    return getattr(module, "FSDPModule", None)


def _contains_fsdp(model: torch.nn.Module) -> bool:
    cls = fsdp_class()
    return cls is not None and any(isinstance(m, cls) for m in model.modules())


def is_fsdp(model: torch.nn.Module) -> bool:
    """Whether ``model`` (a wrapped model) is an FSDP2 module at its root."""
    cls = fsdp_class()
    return cls is not None and isinstance(model, cls)


def check_fsdp_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` given to ``wrap_model`` is FSDP2; raise if it holds FSDP2 modules in a way the
    harness cannot train (inside DDP, or sharded blocks without ``fully_shard`` on the root)."""
    if not _contains_fsdp(model):
        return False
    if isinstance(model, DistributedDataParallel):
        raise TypeError(
            "wrap_model got a DistributedDataParallel around an FSDP2 (fully_shard) model: FSDP2 already "
            "synchronises gradients. Fix: pass the fully_shard model itself; the harness adds no DDP to it"
        )
    if not is_fsdp(model):
        raise TypeError(
            f"wrap_model got a {type(model).__name__} whose submodules are FSDP2 (fully_shard) but the root is "
            "not. Fix: call fully_shard(model) on the root too, after its blocks, then wrap_model(model)"
        )
    return True


def check_model_mix(models: Iterable[torch.nn.Module], size: int) -> None:
    """Raise when trainable FSDP2 and non-FSDP2 models are mixed in a job of several processes (the
    non-FSDP2 ones would be DDP, and checkpoints of the two kinds cannot be combined)."""
    if size <= 1:
        return
    kinds = {is_fsdp(m) for m in models if any(p.requires_grad for p in m.parameters())}
    if kinds == {True, False}:
        raise TypeError(
            "this trial wraps both FSDP2 (fully_shard) models and other trainable models under several "
            "processes; the harness cannot checkpoint that mix. Fix: apply fully_shard to every trainable "
            "model (or freeze the others: requires_grad_(False))"
        )


def set_fsdp_grad_sync(models: Iterable[torch.nn.Module], sync: bool) -> None:
    """FSDP2's ``set_requires_gradient_sync(sync)`` on every FSDP2 model (gradient aggregation: no
    reduce-scatter on the batches that only accumulate)."""
    for model in models:
        if is_fsdp(model):
            model.set_requires_gradient_sync(sync)  # type: ignore[operator]
