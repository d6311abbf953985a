"""The trial of tests/pytorch/test_pytorch_distributed.py, shared by the test process (1 rank) and the rank
workers (tests/support/worker_pytorch_dist.py, 2 ranks): an MLP on indexed synthetic data that records what
each rank saw (training records per batch, local gradients, validation records) and its hook calls."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from trials_pytorch import Recorder

from determined_trials import pytorch

TRAIN_RECORDS = 40  # global batch 8: 5 full global batches per epoch, so 12 batches cross 2 epochs
VALIDATION_RECORDS = 10  # batches of 4, 4 and 2: on 2 ranks, 8 records on rank 0 and 2 on rank 1
LENGTH = 12


def config(aggregation: int = 1) -> dict[str, Any]:
    """Global batch 8, a fixed seed; validation_loss is the searcher metric."""
    return {
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": LENGTH}},
        "hyperparameters": {"global_batch_size": 8, "lr": 0.02},
        "reproducibility": {"experiment_seed": 4321},
        "optimizations": {"aggregation_frequency": aggregation},
    }


def fit_kwargs() -> dict[str, Any]:
    """12 batches; training reports every 3, validation and a checkpoint every 6 (none on policy)."""
    return {
        "max_length": pytorch.Batch(LENGTH), "reporting_period": pytorch.Batch(3),
        "validation_period": pytorch.Batch(6), "checkpoint_period": pytorch.Batch(6),
        "checkpoint_policy": "none", "show_progress": False,
    }


class IndexedData(torch.utils.data.Dataset[Any]):
    """(index, x, y) with y = x @ w + noise, fixed by ``seed``."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=gen)
        w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        self.y = self.x @ w + 0.1 * torch.randn(n, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.tensor(i), self.x[i], self.y[i]


class DistTrial(pytorch.PyTorchTrial):
    """Linear-Tanh-Linear, SGD with momentum, MSE, shuffled training data.

    ``stop_after``: set_stop_requested(True) on that batch_idx (only where the caller constructs it
    so). ``hang_at``: on that batch_idx write ``flag`` and sleep (forever, for the hang test).
    """

    def __init__(
        self, context: pytorch.PyTorchTrialContext, stop_after: int | None = None,
        hang_at: int | None = None, flag: str | None = None,
    ) -> None:
        self.context = context
        self.stop_after, self.hang_at, self.flag = stop_after, hang_at, flag
        self.events: list[tuple[Any, ...]] = []
        self.seen: list[tuple[int, list[int]]] = []  # (batch_idx, record indices)
        self.grads: list[list[float]] = []  # local gradients right after backward, per batch
        self.validated: list[int] = []  # validation record indices, every pass
        self.model = context.wrap_model(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)))
        self.optimizer = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr"), momentum=0.9)
        )

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(IndexedData(TRAIN_RECORDS, 7), batch_size=self.context.get_per_slot_batch_size(),
                                  shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(IndexedData(VALIDATION_RECORDS, 8), batch_size=4)

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"trace": Recorder(self.events)}

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        index, x, y = batch
        if batch_idx == self.hang_at:
            if self.flag:
                Path(self.flag).write_text(str(batch_idx))
            time.sleep(3600)
        self.seen.append((batch_idx, index.tolist()))
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        grads = [p.grad.reshape(-1) for p in self.model.parameters() if p.grad is not None]
        self.grads.append(torch.cat(grads).tolist())
        self.context.step_optimizer(self.optimizer)
        if batch_idx == self.stop_after:
            self.context.set_stop_requested(True)
        return {"loss": loss, "x_mean": x.mean()}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        index, x, y = batch
        self.validated.extend(index.tolist())
        err = self.model(x) - y
        return {
            "validation_loss": (err ** 2).mean(),  # AVG: weighted by records across batches and ranks
            "sq_err_sum": (err ** 2).sum(), "records": torch.tensor(len(index)),  # SUM
            "err_max": err.max(), "index_max": index.max(),  # MAX
            "err_min": err.min(), "index_min": index.min(),  # MIN
        }

    def evaluation_reducer(self) -> dict[str, pytorch.Reducer]:
        R = pytorch.Reducer
        return {"validation_loss": R.AVG, "sq_err_sum": R.SUM, "records": R.SUM, "err_max": R.MAX,
                "index_max": R.MAX, "err_min": R.MIN, "index_min": R.MIN}


def weights(trial: DistTrial) -> dict[str, list[Any]]:
    """The user model's parameters (DDP wrapper removed) as nested lists."""
    inner = trial.context._inner_models()[0]
    return {name: value.tolist() for name, value in inner.state_dict().items()}
