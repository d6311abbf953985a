"""A PyTorchTrial that trains on a stream: scikit-learn's digits read through ``DigitsStream`` (stream.py), an
``IterableDataset`` that saves its position, given to ``det.pytorch.DataLoader`` like any dataset."""

from __future__ import annotations

from typing import Any

import torch
from stream import DigitsStream
from torch import nn

from determined_trials import pytorch


class StreamingDigitsTrial(pytorch.PyTorchTrial):
    """An MLP with dropout on the digits stream; reports loss and accuracy. ``seen`` holds, per batch trained by
    this process, (epoch_idx, batch_idx, the rows of its records), for train.py to show where a run went on."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hidden = context.get_hparam("hidden_size")
        self.model = context.wrap_model(nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(context.get_hparam("dropout")), nn.Linear(hidden, 10),
        ))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(
            self.model.parameters(), lr=context.get_hparam("learning_rate"), momentum=context.get_hparam("momentum"),
        ))
        self.seen: list[tuple[int, int, list[int]]] = []

    def build_training_data_loader(self) -> pytorch.DataLoader:
        stream = DigitsStream("train", shuffle_seed=self.context.get_trial_seed())  # a new order every epoch
        return pytorch.DataLoader(stream, batch_size=self.context.get_per_slot_batch_size(),
                                  num_workers=self.context.get_hparam("workers"))

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(DigitsStream("validation"), batch_size=120)  # one pass per validation

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, torch.Tensor]:
        self.seen.append((epoch_idx, batch_idx, batch["index"].tolist()))
        logits = self.model(batch["image"])
        loss = nn.functional.cross_entropy(logits, batch["label"])
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss, "accuracy": (logits.argmax(dim=1) == batch["label"]).float().mean()}

    def evaluate_batch(self, batch: Any, batch_idx: int = 0) -> dict[str, torch.Tensor]:
        logits = self.model(batch["image"])
        return {
            "validation_loss": nn.functional.cross_entropy(logits, batch["label"]),
            "validation_accuracy": (logits.argmax(dim=1) == batch["label"]).float().mean(),
        }
