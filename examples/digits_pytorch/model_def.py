"""A PyTorchTrial on scikit-learn's digits (8x8 images, 10 classes): a small MLP with dropout."""

from __future__ import annotations

from typing import Any

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

import determined_trials as det
from determined_trials import pytorch


def digits_datasets() -> tuple[TensorDataset, TensorDataset]:
    """Training and validation splits (80/20, fixed), pixels scaled to [0, 1]."""
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x / 16.0, y, test_size=0.2, random_state=0)

    def dataset(xs: Any, ys: Any) -> TensorDataset:
        return TensorDataset(torch.tensor(xs, dtype=torch.float32), torch.tensor(ys, dtype=torch.long))

    return dataset(x_train, y_train), dataset(x_val, y_val)


class DigitsTrial(pytorch.PyTorchTrial):
    """Classifies digits; reports loss and accuracy."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hidden = context.get_hparam("hidden_size")
        self.model = context.wrap_model(nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(context.get_hparam("dropout")), nn.Linear(hidden, 10),
        ))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(
            self.model.parameters(), lr=context.get_hparam("learning_rate"), momentum=context.get_hparam("momentum"),
        ))
        self.lr_scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=4, gamma=0.5),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
        )
        self.train_data, self.val_data = digits_datasets()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.train_data, batch_size=self.context.get_per_slot_batch_size(), shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.val_data, batch_size=256)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, torch.Tensor]:
        images, labels = batch
        logits = self.model(images)
        loss = nn.functional.cross_entropy(logits, labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss, "accuracy": (logits.argmax(dim=1) == labels).float().mean()}

    def evaluate_batch(self, batch: Any) -> dict[str, torch.Tensor]:
        images, labels = batch
        logits = self.model(images)
        return {
            "validation_loss": nn.functional.cross_entropy(logits, labels),
            "validation_accuracy": (logits.argmax(dim=1) == labels).float().mean(),
        }


_ = det  # the trial is importable as model_def:DigitsTrial
