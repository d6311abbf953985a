"""Gradients accumulated between two optimizer steps (gradient aggregation) in FSDP2 trials: FSDP2 keeps
them unsharded and unsynchronised in each rank's ``_unsharded_param.grad`` until the batch that steps,
so a checkpoint taken in between saves and restores them per rank (same number of processes only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from determined_trials.pytorch.parallel._ddp import plain_module
from determined_trials.pytorch.parallel._fsdp import fsdp_class, is_fsdp

__all__ = ["apply_restored_grads", "pending_fsdp_grads", "restore_fsdp_grads"]


def _grad_holders(model: torch.nn.Module) -> Iterator[Any]:
    """The tensors whose ``.grad`` holds the gradients accumulated so far, in a fixed order."""
    if not is_fsdp(model):
        yield from plain_module(model).parameters()
        return
    cls = fsdp_class()
    for module in model.modules():
        if cls is None or not isinstance(module, cls):
            continue
        group = module._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]
        for fsdp_param in (group.fsdp_params if group is not None else []):
            yield fsdp_param._unsharded_param if hasattr(fsdp_param, "_unsharded_param") else fsdp_param.sharded_param


def pending_fsdp_grads(context: Any) -> list[list[torch.Tensor | None]]:
    """Per model, copies of the gradients accumulated since the last step ([] without aggregation)."""
    if context._aggregation_frequency == 1:
        return []
    return [[None if t.grad is None else t.grad.detach().clone() for t in _grad_holders(m)] for m in context.models]


def restore_fsdp_grads(saved: list[list[torch.Tensor | None]], context: Any) -> None:
    """Put back what ``pending_fsdp_grads`` saved (same number of processes): at once into plain models;
    into an FSDP2 model at the next ``context.backward``, once its forward has made the unsharded
    parameters that accumulate them (``apply_restored_grads``)."""
    later = []
    for model, grads in zip(context.models, saved):
        if is_fsdp(model):
            later.append((model, grads))
            continue
        for holder, grad in zip(_grad_holders(model), grads):
            holder.grad = None if grad is None else grad.to(holder.device)
    context._restore_grads = later or None


def apply_restored_grads(restore: list[tuple[torch.nn.Module, list[torch.Tensor | None]]]) -> None:
    """After the first forward since a resume: the saved accumulated gradients into FSDP2's unsharded
    parameters, where the coming backward adds to them (and the next synchronised one reduces them)."""
    for model, grads in restore:
        holders = list(_grad_holders(model))
        if len(holders) != len(grads):
            raise RuntimeError(f"the checkpoint holds {len(grads)} accumulated gradients for an FSDP2 model with "
                               f"{len(holders)} parameters")
        for holder, grad in zip(holders, grads):
            holder.grad = None if grad is None else grad.to(holder.device)
