"""DistributedDataParallel for wrapped models: attribute fall-through to the inner module, and
switching its gradient sync off on the batches that only accumulate (gradient aggregation)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

__all__ = ["DDPModel", "set_grad_sync", "torch_distributed_ready", "unwrap", "wrap_ddp"]


class DDPModel(DistributedDataParallel):
    """DDP whose missing attributes come from the inner module (`model.my_head` keeps working)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":  # not set yet (inside DDP's constructor): no fall-through
                raise
            return getattr(self.module, name)


def torch_distributed_ready() -> bool:
    """Whether torch.distributed has a default process group (DDP needs one)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> DDPModel:
    """`model` (already on `device`) in DDP; one device per process."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DDPModel(model, device_ids=device_ids)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside a DDP wrapper (the model itself otherwise)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def set_grad_sync(models: Iterable[torch.nn.Module], sync: bool) -> None:
    """Turn DDP's gradient all-reduce on or off for the coming forward and backward passes.

    This is what `DistributedDataParallel.no_sync()` does for the span of its block; DDP reads
    the flag in `forward`, so a `no_sync()` around `backward` alone would not skip the all-reduce.
    """
    for model in models:
        if isinstance(model, DistributedDataParallel):
            model.require_backward_grad_sync = sync
