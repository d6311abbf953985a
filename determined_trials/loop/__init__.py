"""The framework-agnostic loop: units, schedule, the trial's clock (counters, epochs and their hooks, the
batch being trained), hook order, the cross-rank metric reduction the adapters call, controller, and the
one ``fit`` front every family's ``Trainer`` shares (``_fit``).

Imports neither torch nor tensorflow; the PyTorch, DeepSpeed and Keras adapters run under it.

May import: errors, _info, config, core.*
"""

from determined_trials.loop._adapter import (
    DataShape,
    SaveMode,
    ShardedAsyncSaver,
    SnapshotSaver,
    StopCheck,
    TrialAdapter,
    first_mismatched_key,
)
from determined_trials.loop._clock import Clock, ClockView
from determined_trials.loop._controller import (
    CHECKPOINT_FORMAT,
    TRIAL_STATE_FILE,
    Controller,
    ExitReason,
    LoopSettings,
)
from determined_trials.loop._data_order import (
    derive_seed_words,
    epoch_permutation,
    global_epoch_len,
    rank_bounds,
    validate_layout,
    warn_if_short_of_one_batch,
    worker_seed_words,
)
from determined_trials.loop._fit import TrainerFront, experiment_config, open_trial_context
from determined_trials.loop._hooks import HookRunner
from determined_trials.loop._progress import Progress, progress_enabled, summary_line
from determined_trials.loop._ranks import allgather, reduce_across_ranks
from determined_trials.loop._schedule import Boundary, Schedule
from determined_trials.loop._units import (
    Batch,
    BatchRule,
    Epoch,
    Record,
    TrainUnit,
    unit_from_length,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "TRIAL_STATE_FILE",
    "Batch",
    "BatchRule",
    "Boundary",
    "Clock",
    "ClockView",
    "Controller",
    "DataShape",
    "Epoch",
    "ExitReason",
    "HookRunner",
    "LoopSettings",
    "Progress",
    "Record",
    "SaveMode",
    "Schedule",
    "ShardedAsyncSaver",
    "SnapshotSaver",
    "StopCheck",
    "TrainUnit",
    "TrialAdapter",
    "allgather",
    "first_mismatched_key",
    "progress_enabled",
    "reduce_across_ranks",
    "summary_line",
    "unit_from_length",
    "TrainerFront",
    "derive_seed_words",
    "epoch_permutation",
    "experiment_config",
    "global_epoch_len",
    "open_trial_context",
    "rank_bounds",
    "validate_layout",
    "warn_if_short_of_one_batch",
    "worker_seed_words",
]
