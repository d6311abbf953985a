"""``det.pytorch``: PyTorchTrial, its context, data loader, reducers, LR schedulers, callbacks and
the Trainer, with Determined's public names.

Owns the adapter and its batch loop (``_adapter``, ``_batch_loop``), metrics and reducers (``_metrics``,
``_reducer``), the trial class, its context and what every torch-based context shares (``_trial``,
``_context``, ``_services``, ``_experimental``), callbacks, TensorBoard, the ``Trainer`` and loading a trial
from a checkpoint (``_load``). Its rooms: ``data/`` (the data chain), ``checkpoint/`` (checkpoint files,
host snapshots, DCP), ``parallel/`` (DDP, FSDP2), ``device/`` (device, AMP) and ``optim/`` (the optimizer
step, the LR scheduler wrapper). ``deepspeed.py`` is ``det.deepspeed`` itself (a named exception).

May import: errors, _info, _compat, _format, config, core.*, loop, _trial_context, pytorch.*
"""

from determined_trials.loop import Batch, Epoch, Record, TrainUnit
from determined_trials.pytorch import samplers
from determined_trials.pytorch._callback import PyTorchCallback
from determined_trials.pytorch._compat import TorchData, adapt_batch_sampler, to_device
from determined_trials.pytorch._context import PyTorchTrialContext
from determined_trials.pytorch._load import CheckpointLoadContext, load_trial_from_checkpoint_path
from determined_trials.pytorch._services import TrialServices
from determined_trials.pytorch._trainer import Trainer, collective_timeout, init, seed_everything
from determined_trials.pytorch._trial import PyTorchTrial
from determined_trials.pytorch.data import DataLoader
from determined_trials.pytorch.metrics import MetricReducer, Reducer
from determined_trials.pytorch.optim import LRScheduler
from determined_trials.pytorch.samplers import data_length

__all__ = [
    "Batch",
    "CheckpointLoadContext",
    "DataLoader",
    "Epoch",
    "LRScheduler",
    "MetricReducer",
    "PyTorchCallback",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "Record",
    "Reducer",
    "TrainUnit",
    "TorchData",
    "Trainer",
    "adapt_batch_sampler",
    "data_length",
    "init",
    "load_trial_from_checkpoint_path",
    "samplers",
    "to_device",
    # what the other packages of determined_trials use (not Determined's API):
    "TrialServices",
    "collective_timeout",
    "seed_everything",
]


def __getattr__(name: str) -> object:
    """``det.pytorch.deepspeed``, imported on first access (it is ``det.deepspeed``; importing this package
    imports no deepspeed)."""
    if name == "deepspeed":
        import importlib

        return importlib.import_module("determined_trials.pytorch.deepspeed")
    raise AttributeError(f"module 'determined_trials.pytorch' has no attribute {name!r}")
