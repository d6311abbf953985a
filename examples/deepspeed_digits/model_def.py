"""A DeepSpeedTrial on scikit-learn's digits (8x8 images, 10 classes): an MLP trained by a DeepSpeed engine
whose config is ds_config.json with the batch size, learning rate and ZeRO stage taken from the hyperparameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deepspeed
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

from determined_trials import deepspeed as det_ds
from determined_trials import pytorch

DS_CONFIG = Path(__file__).with_name("ds_config.json")


def digits_datasets() -> tuple[TensorDataset, TensorDataset]:
    """Training and validation splits (80/20, fixed), pixels scaled to [0, 1]."""
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x / 16.0, y, test_size=0.2, random_state=0)
    return (TensorDataset(torch.tensor(x_train, dtype=torch.float32), torch.tensor(y_train)),
            TensorDataset(torch.tensor(x_val, dtype=torch.float32), torch.tensor(y_val)))


class DigitsDeepSpeedTrial(det_ds.DeepSpeedTrial):
    """Classifies digits; train_batch runs one micro-batch (the harness calls it once per accumulation step)."""

    def __init__(self, context: det_ds.DeepSpeedTrialContext) -> None:
        self.context = context
        hp = context.get_hparams()
        ds_config = det_ds.overwrite_deepspeed_config(DS_CONFIG, {
            "train_batch_size": hp["global_batch_size"],
            "optimizer": {"params": {"lr": hp["learning_rate"]}},
            "scheduler": {"params": {"warmup_max_lr": hp["learning_rate"]}},
            "zero_optimization": {"stage": hp["zero_stage"]},
        })
        hidden = hp["hidden_size"]
        model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        self.engine = context.wrap_model_engine(engine)
        self.train_data, self.val_data = digits_datasets()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.train_data, batch_size=self.context.get_train_micro_batch_size_per_gpu(),
                                  shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.val_data, batch_size=128)

    def train_batch(self, dataloader_iter: Any, epoch_idx: int, batch_idx: int) -> dict[str, torch.Tensor]:
        images, labels = self.context.to_device(next(dataloader_iter))
        logits = self.engine(images)
        loss = nn.functional.cross_entropy(logits, labels)
        self.engine.backward(loss)
        self.engine.step()
        return {"loss": loss, "accuracy": (logits.argmax(dim=1) == labels).float().mean()}

    def evaluate_batch(self, dataloader_iter: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        images, labels = self.context.to_device(next(dataloader_iter))
        logits = self.engine(images)
        return {
            "validation_loss": nn.functional.cross_entropy(logits, labels),
            "validation_accuracy": (logits.argmax(dim=1) == labels).float().mean(),
        }
