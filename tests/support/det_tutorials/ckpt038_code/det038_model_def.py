"""The trial inside the fixture 0.38 checkpoint's code/ folder (imported from there by the loader)."""

from typing import Any

import torch
from torch import nn

import determined_trials as det


class TinyRegression(det.pytorch.PyTorchTrial):
    def __init__(self, context: det.pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr")))

    def _data(self) -> det.pytorch.DataLoader:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(16, 3, generator=gen)
        return det.pytorch.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    def build_training_data_loader(self) -> det.pytorch.DataLoader:
        return self._data()

    def build_validation_data_loader(self) -> det.pytorch.DataLoader:
        return self._data()

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return loss

    def evaluate_batch(self, batch: Any) -> Any:
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}
