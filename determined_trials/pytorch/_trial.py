"""PyTorchTrial: the class users subclass, and the checks of what it defines."""

from __future__ import annotations

import abc
import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from determined_trials.pytorch._callback import PyTorchCallback
    from determined_trials.pytorch._context import PyTorchTrialContext
    from determined_trials.pytorch.data import DataLoader
    from determined_trials.pytorch.metrics import Reducer

__all__ = ["PyTorchTrial", "check_trial_class", "evaluate_takes_batch_idx"]


class PyTorchTrial(abc.ABC):
    """Define ``__init__(context)``, the data loaders, ``train_batch`` and exactly one of
    ``evaluate_batch`` / ``evaluate_full_dataset``; the harness does the rest."""

    @abc.abstractmethod
    def __init__(self, context: PyTorchTrialContext) -> None:
        """Build and wrap models, optimizers, LR schedulers and reducers with ``context``."""

    @abc.abstractmethod
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor | dict[str, Any]:
        """Train one batch; return the loss tensor or a dict of metrics (kept on the device)."""

    @abc.abstractmethod
    def build_training_data_loader(self) -> DataLoader:
        """A ``det.pytorch.DataLoader`` with the per-slot batch size."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> DataLoader:
        """A ``det.pytorch.DataLoader`` over the validation data."""

    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        """Named callbacks, run in this order."""
        return {}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        """Metrics of one validation batch, reduced by ``evaluation_reducer()``."""
        raise NotImplementedError

    def evaluate_full_dataset(self, data_loader: torch.utils.data.DataLoader) -> dict[str, Any]:
        """Metrics of the whole validation set (run on the chief only)."""
        raise NotImplementedError

    def evaluation_reducer(self) -> Reducer | dict[str, Reducer]:
        """How ``evaluate_batch`` metrics are reduced: one Reducer, or one per metric name."""
        from determined_trials.pytorch.metrics import Reducer

        return Reducer.AVG

    def get_batch_length(self, batch: Any) -> int:
        """The number of records in ``batch`` (used for Record units and AVG weighting)."""
        from determined_trials.pytorch.data import data_length

        return data_length(batch)


def _overrides(trial_class: type, name: str) -> bool:
    return getattr(trial_class, name) is not getattr(PyTorchTrial, name)


def check_trial_class(trial_class: type) -> None:
    """Raise a clear error when the class is not a usable PyTorchTrial."""
    if not (isinstance(trial_class, type) and issubclass(trial_class, PyTorchTrial)):
        raise TypeError(f"{trial_class!r} is not a subclass of det.pytorch.PyTorchTrial")
    batch, full = _overrides(trial_class, "evaluate_batch"), _overrides(trial_class, "evaluate_full_dataset")
    if batch == full:
        which = "both" if batch else "neither"
        raise TypeError(
            f"{trial_class.__name__} defines {which} of evaluate_batch() and evaluate_full_dataset(); "
            "define exactly one of them"
        )


def evaluate_takes_batch_idx(trial: PyTorchTrial) -> bool:
    """Whether the trial's ``evaluate_batch`` accepts a ``batch_idx`` argument."""
    params = list(inspect.signature(trial.evaluate_batch).parameters.values())
    return len(params) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)
