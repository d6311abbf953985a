"""DeepSpeedTrial: the class users subclass, its default save/load, and the checks of what it defines."""

from __future__ import annotations

import abc
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from determined_trials.deepspeed._context import DeepSpeedTrialContext
    from determined_trials.pytorch import PyTorchCallback
    from determined_trials.pytorch.metrics import Reducer

__all__ = ["DeepSpeedTrial", "check_trial_class"]


class DeepSpeedTrial(abc.ABC):
    """Build and wrap DeepSpeed engines in ``__init__``; ``train_batch`` and ``evaluate_batch`` pull
    their (micro-)batches from the iterator they are given; the harness does the rest."""

    @abc.abstractmethod
    def __init__(self, context: DeepSpeedTrialContext) -> None:
        """Build the model, ``deepspeed.initialize`` it and ``context.wrap_model_engine`` the engine."""

    @abc.abstractmethod
    def train_batch(self, dataloader_iter: Iterator[Any] | None, epoch_idx: int,
                    batch_idx: int) -> torch.Tensor | dict[str, Any]:
        """Train one micro-batch (called gradient_accumulation_steps times per batch), or a whole batch
        with a pipeline engine or after ``disable_auto_grad_accumulation()``; return metrics."""

    @abc.abstractmethod
    def evaluate_batch(self, dataloader_iter: Iterator[Any] | None, batch_idx: int) -> dict[str, Any]:
        """Metrics of one validation batch (pulled from ``dataloader_iter``), reduced by ``evaluation_reducer()``."""

    @abc.abstractmethod
    def build_training_data_loader(self) -> Any:
        """A ``det.pytorch.DataLoader`` with ``train_micro_batch_size_per_gpu`` records per batch."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> Any:
        """A ``det.pytorch.DataLoader`` over the validation data."""

    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        """Named callbacks, run in this order."""
        return {}

    def evaluation_reducer(self) -> Reducer | dict[str, Reducer]:
        """How ``evaluate_batch`` metrics are reduced: one Reducer, or one per metric name."""
        from determined_trials.pytorch.metrics import Reducer

        return Reducer.AVG

    def save(self, context: DeepSpeedTrialContext, path: Path) -> None:
        """Called on every rank: each wrapped engine's ``save_checkpoint(path, tag="model<i>")``."""
        for index, engine in enumerate(context.models):
            engine.save_checkpoint(str(path), tag=f"model{index}")

    def load(self, context: DeepSpeedTrialContext, path: Path) -> None:
        """Called on every rank: each wrapped engine's ``load_checkpoint(path, tag="model<i>")``."""
        for index, engine in enumerate(context.models):
            tag = f"model{index}"
            loaded, _ = engine.load_checkpoint(str(path), tag=tag)
            if loaded is None:
                raise RuntimeError(
                    f"Failed to load DeepSpeed checkpoint {tag!r} from {path}: it has no such engine checkpoint; "
                    "resume with the same engines, wrapped in the same order, as the trial that saved it"
                )


def check_trial_class(trial_class: type) -> None:
    """Raise a clear TypeError when the class is not a usable DeepSpeedTrial."""
    if not (isinstance(trial_class, type) and issubclass(trial_class, DeepSpeedTrial)):
        raise TypeError(f"{trial_class!r} is not a subclass of det.deepspeed.DeepSpeedTrial")
    if inspect.isabstract(trial_class):
        missing = ", ".join(sorted(getattr(trial_class, "__abstractmethods__", ())))
        raise TypeError(f"{trial_class.__name__} does not define {missing}; a DeepSpeedTrial needs them")
