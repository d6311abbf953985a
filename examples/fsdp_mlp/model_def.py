"""An MLP trained with FSDP2 under PyTorchTrial: ``fully_shard`` on each block, then on the root, when
torch.distributed runs (2 processes on the CPU with gloo, or GPUs with nccl); unsharded in one process
(e.g. ``det.pytorch.load_trial_from_checkpoint_path`` for inference). See docs/fsdp.md."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from determined_trials import pytorch


def regression_data(n: int, seed: int) -> torch.utils.data.TensorDataset:
    """y = sin(x @ w) on 8 features, fixed by ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=gen)
    w = torch.randn(8, 1, generator=gen)
    return torch.utils.data.TensorDataset(x, torch.sin(x @ w))


class Block(nn.Module):
    """A residual MLP block: x + W2 tanh(W1 norm(x))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def build_model(width: int, depth: int) -> nn.Module:
    """The MLP, sharded with FSDP2 (each block, then the root) when torch.distributed is initialised."""
    model = MLP(width, depth)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    return model


class FSDPMLPTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hp = context.get_hparams()
        self.model = context.wrap_model(build_model(hp.get("width", 32), hp.get("depth", 2)))
        self.optimizer = context.wrap_optimizer(torch.optim.AdamW(self.model.parameters(), lr=hp.get("lr", 0.01)))
        context.wrap_lr_scheduler(torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=10, gamma=0.9),
                                  pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
        self.sleep = float(hp.get("sleep", 0.0))
        self.clip = float(hp.get("clip", 1.0))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(regression_data(256, 0), batch_size=self.context.get_per_slot_batch_size(),
                                  shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(regression_data(64, 1), batch_size=16)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer, clip_grads=self._clip)
        print(f"rank {self.context.distributed.get_rank()} trained batch {batch_idx}", flush=True)
        if self.sleep:
            time.sleep(self.sleep)
        return {"loss": loss}

    def _clip(self, params: list[torch.Tensor]) -> None:
        nn.utils.clip_grad_norm_(params, self.clip)  # FSDP2: DTensor gradients, the norm of the whole model

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}
