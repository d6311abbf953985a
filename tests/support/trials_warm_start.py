"""A small PyTorchTrial for the warm-start tests (``searcher.source_trial_id`` / ``source_checkpoint_uuid``): at its
first batch it prints the facts a warm start must get right, one JSON line after ``first batch: ``."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from determined_trials import pytorch

FIRST_BATCH = "first batch: "


class _Data(torch.utils.data.Dataset[Any]):
    def __init__(self, n: int = 16) -> None:
        gen = torch.Generator().manual_seed(5)
        self.x = torch.randn(n, 4, generator=gen)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class WarmTrial(pytorch.PyTorchTrial):
    """Linear(4, hidden) -> Linear(hidden, 1), Adam at ``lr`` with a StepLR; ``hidden`` changes the shapes."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hidden = int(context.get_hparam("hidden"))
        self.model = context.wrap_model(nn.Sequential(nn.Linear(4, hidden), nn.Linear(hidden, 1)))
        self.opt = context.wrap_optimizer(torch.optim.Adam(self.model.parameters(), lr=context.get_hparam("lr")))
        self.sched = context.wrap_lr_scheduler(torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5),
                                               pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
        self._told = False

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(_Data(), batch_size=self.context.get_per_slot_batch_size(), shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(_Data(8), batch_size=4)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        if not self._told:
            self._told = True
            print(FIRST_BATCH + json.dumps({
                "batch_idx": batch_idx, "epoch_idx": epoch_idx,
                "weights": {k: v.reshape(-1).tolist() for k, v in self.model.state_dict().items()},
                "optimizer_state": len(self.opt.state), "lr": self.opt.param_groups[0]["lr"],
            }), flush=True)
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}
