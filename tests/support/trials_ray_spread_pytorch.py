"""The Ray multi-node tests' tiny PyTorchTrial: each rank says once which Ray node it runs on
(``DET_RAY_NODE_ID``) and its process id; copied into the context folder as ``spread_trial.py``."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from determined_trials import pytorch


def _records() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=gen)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


class SpreadTrial(pytorch.PyTorchTrial):
    def __init__(self, context: Any) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(4, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.05))
        rank = context.distributed.get_rank()
        print(f"rank {rank} of {context.distributed.get_size()} on node {os.environ.get('DET_RAY_NODE_ID')} "
              f"pid {os.getpid()}", flush=True)

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(_records(), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> Any:
        return pytorch.DataLoader(_records(), batch_size=8)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        time.sleep(self.context.get_hparams()["sleep"])
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}
