"""The Core API (``det.core``): init, Context and its contexts; its rooms hold checkpoint storage
(``storage/``), the local store (``store/``), the store channel of remote trials (``channel/``) and the
collectives' transport (``transport/``).

Imports neither torch nor tensorflow.

May import: errors, _info, config, core.*
"""

from determined_trials.core._checkpoint import CheckpointContext, CheckpointRecorder, DownloadMode
from determined_trials.core._checkpoint_helpers import read_json_file
from determined_trials.core._context import LAUNCH_DIR_ENV, PREEMPTED_MARKER, Context, init, resolve_run_dir
from determined_trials.core._distributed import DistributedContext
from determined_trials.core._preempt import PreemptContext, PreemptMode
from determined_trials.core._profiler import ProfilerContext
from determined_trials.core._progress import experiment_progress, planned_trials, trial_progress
from determined_trials.core._resume import LATEST, continue_bare_run, resolve_latest
from determined_trials.core._searcher import (
    SearcherContext,
    SearcherMode,
    SearcherOperation,
    Unit,
)
from determined_trials.core._staged import StagedCheckpoint
from determined_trials.core._train import EarlyExitReason, TensorboardMode, TrainContext
from determined_trials.core.store import (
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
    # what the other packages of determined_trials use (not Determined's API):
    "CheckpointRecorder",
    "LATEST",
    "LAUNCH_DIR_ENV",
    "PREEMPTED_MARKER",
    "continue_bare_run",
    "experiment_progress",
    "planned_trials",
    "read_json_file",
    "resolve_latest",
    "resolve_run_dir",
    "trial_progress",
]
