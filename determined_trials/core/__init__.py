"""The Core API (``det.core``): init, Context and its contexts; its rooms hold checkpoint storage
(``storage/``), the local store (``store/``), the store channel of remote trials (``channel/``) and the
collectives' transport (``transport/``).

Imports neither torch nor tensorflow.

May import: errors, _info, config, core.*
"""

from determined_trials.core._checkpoint import CheckpointContext, DownloadMode
from determined_trials.core._context import Context, init
from determined_trials.core._distributed import DistributedContext
from determined_trials.core._preempt import PreemptContext, PreemptMode
from determined_trials.core._profiler import ProfilerContext
from determined_trials.core._searcher import (
    SearcherContext,
    SearcherMode,
    SearcherOperation,
    Unit,
)
from determined_trials.core._staged import StagedCheckpoint
from determined_trials.core._train import EarlyExitReason, TensorboardMode, TrainContext
from determined_trials.core.store._local import (
    CheckpointRecord,
    Experiment,
    LocalStore,
    MetricRecord,
    Trial,
)

__all__ = [
    "CheckpointContext",
    "CheckpointRecord",
    "Context",
    "DistributedContext",
    "DownloadMode",
    "EarlyExitReason",
    "Experiment",
    "LocalStore",
    "MetricRecord",
    "PreemptContext",
    "PreemptMode",
    "ProfilerContext",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "StagedCheckpoint",
    "TensorboardMode",
    "TrainContext",
    "Trial",
    "Unit",
    "init",
]
