"""DistributedDataParallel for wrapped models: attribute fall-through to the inner module, and
switching its gradient sync off on the batches that only accumulate (gradient aggregation); the
user's module under DDP and ``torch.compile`` wrappers, and state dicts with its plain keys."""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "COMPILED_PREFIX",
    "DDPModel",
    "plain_module",
    "plain_state_dict",
    "set_grad_sync",
    "torch_distributed_ready",
    "unwrap",
    "wrap_ddp",
]

COMPILED_PREFIX = "_orig_mod."  # what torch.compile's wrapper puts before its module's state_dict keys


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


def _compiled_wrapper_class() -> type | None:
    """torch.compile's wrapper class, if torch.compile was ever used (nothing is imported for it)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None)


def plain_module(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module under any DDP and ``torch.compile`` wrappers: its ``state_dict`` has the keys
    of the model as written (no ``module.`` or ``_orig_mod.``) and loads into it compiled or not."""
    compiled = _compiled_wrapper_class()
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif compiled is not None and isinstance(model, compiled):
            model = model.get_submodule("_orig_mod")
        else:
            return model


def plain_state_dict(state: Mapping[str, Any], module: torch.nn.Module) -> Mapping[str, Any]:
    """``state`` for ``module`` (a ``plain_module``): a state dict saved from a compiled model's wrapper
    (every key under ``_orig_mod.``, as checkpoints written before plain keys were) loses the prefix;
    anything else is returned as is."""
    if not state or not all(key.startswith(COMPILED_PREFIX) for key in state):
        return state
    own = module.state_dict().keys()
    if own and all(key.startswith(COMPILED_PREFIX) for key in own):
        return state  # the module itself has a child named _orig_mod
    stripped: collections.OrderedDict[str, Any] = collections.OrderedDict(state)
    metadata = getattr(state, "_metadata", None)
    if metadata is not None:
        stripped._metadata = collections.OrderedDict(metadata)  # type: ignore[attr-defined]
    while stripped and all(key.startswith(COMPILED_PREFIX) for key in stripped):  # compiled twice
        consume_prefix_in_state_dict_if_present(stripped, COMPILED_PREFIX)
    return stripped
