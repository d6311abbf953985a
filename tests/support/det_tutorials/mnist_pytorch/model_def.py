"""A PyTorchTrial with the shape of Determined 0.38's mnist_pytorch tutorial: the same det.pytorch
names, hooks and context calls; only the import line differs."""

import pathlib
from typing import Any

import data
import model
import torch
from torch import nn

from determined_trials import pytorch


class MNistTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext, hparams: dict | None = None) -> None:
        self.context = context
        hparams = hparams if hparams is not None else context.get_hparams()

        # Trial-level constants.
        self.data_dir = pathlib.Path("data")
        self.batch_size = hparams.get("global_batch_size", 64)
        self.per_slot_batch_size = self.batch_size // self.context.distributed.get_size()

        self.loss_fn = nn.NLLLoss()
        self.model = self.context.wrap_model(model.build_model(hparams=hparams))
        self.optimizer = self.context.wrap_optimizer(
            torch.optim.Adadelta(self.model.parameters(), lr=hparams["learning_rate"])
        )

    def build_training_data_loader(self) -> pytorch.DataLoader:
        train_data = data.get_dataset(self.data_dir, train=True)
        return pytorch.DataLoader(train_data, batch_size=self.per_slot_batch_size)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        validation_data = data.get_dataset(self.data_dir, train=False)
        return pytorch.DataLoader(validation_data, batch_size=self.per_slot_batch_size)

    def train_batch(self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int) -> dict[str, torch.Tensor]:
        batch_data, labels = batch
        output = self.model(batch_data)
        loss = self.loss_fn(output, labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: pytorch.TorchData, batch_idx: int) -> dict[str, Any]:
        batch_data, labels = batch
        output = self.model(batch_data)
        validation_loss = self.loss_fn(output, labels).item()
        pred = output.argmax(dim=1, keepdim=True)
        accuracy = pred.eq(labels.view_as(pred)).sum().item() / len(batch_data)
        return {"validation_loss": validation_loss, "accuracy": accuracy, "batch": self.context.current_train_batch()}
