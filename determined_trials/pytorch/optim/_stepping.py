"""One optimizer step after gradient aggregation: average the accumulated gradients, unscale and
clip them, step (through a GradScaler when one is in use) and zero them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

__all__ = ["ClipGrads", "check_params_wrapped", "optimizer_params", "step_optimizer"]

logger = logging.getLogger("determined_trials.pytorch")

ClipGrads = Callable[[list[torch.Tensor]], Any]


def optimizer_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """Every parameter the optimizer updates, group by group."""
    for group in optimizer.param_groups:
        yield from group["params"]


def check_params_wrapped(optimizer: torch.optim.Optimizer, models: Iterable[torch.nn.Module]) -> None:
    """Raise if none of the optimizer's parameters is in a wrapped model; warn if some are not."""
    wrapped = {id(p) for model in models for p in model.parameters()}
    params = list(optimizer_params(optimizer))
    outside = [p for p in params if id(p) not in wrapped]
    if params and len(outside) == len(params):
        raise ValueError(
            "wrap_optimizer: none of the optimizer's parameters belong to a wrapped model, so the "
            "model would be neither moved to the device nor checkpointed. Fix: "
            "model = context.wrap_model(model) first, then build the optimizer on model.parameters()"
        )
    if outside:
        logger.warning(
            "wrap_optimizer: %d of the optimizer's %d parameters are not in a wrapped model; they "
            "are not checkpointed or moved to the device", len(outside), len(params),
        )


def _average_grads(optimizer: torch.optim.Optimizer, divisor: int) -> None:
    dense: list[torch.Tensor] = []
    for param in optimizer_params(optimizer):
        grad = param.grad
        if grad is None:
            continue
        if grad.is_sparse:
            grad.div_(divisor)
        else:
            dense.append(grad)
    if dense:
        with torch.no_grad():
            torch._foreach_div_(dense, divisor)


def step_optimizer(
    optimizer: torch.optim.Optimizer,
    *,
    aggregation: int,
    average: bool,
    clip_grads: ClipGrads | None,
    scaler: Any,
    auto_zero_grads: bool,
) -> None:
    """Step `optimizer` once with the gradients accumulated over `aggregation` batches."""
    if average and aggregation > 1:
        _average_grads(optimizer, aggregation)
    if clip_grads is not None:
        if scaler is not None:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        clip_grads(list(optimizer_params(optimizer)))
    if scaler is not None:
        scaler.step(optimizer)
    else:
        optimizer.step()
    if auto_zero_grads:
        optimizer.zero_grad()
