"""A regression PyTorchTrial base shared by the benchmarks: MSE loss, one optimizer step per batch."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from determined_trials import pytorch

__all__ = ["MSETrial"]


class MSETrial(pytorch.PyTorchTrial):
    """Subclasses set ``context``, ``model`` and ``optimizer`` and build the data loaders."""

    context: pytorch.PyTorchTrialContext
    model: nn.Module
    optimizer: torch.optim.Optimizer

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return loss

    def evaluate_batch(self, batch: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}
