"""Experiment trackers (MLflow, Weights & Biases) and TensorBoard's scalars: one tracker run per trial, resumed by
every later attempt of the trial, fed from the store by a forwarder (``_forwarder``) with each metric row as it is
stored and no step twice (``_progress``); for MLflow and W&B in a helper process the chief rank starts and stops
(``_helper``, ``_helper_main``: the clients run off the training process, TensorBoard's with them), for TensorBoard
alone on a thread of the chief; the runs' clients (``_mlflow``, ``_wandb``: imported lazily, only in the helper and
the runner; ``_tensorboard``), the checks made before any trial runs, the runner's last word on an ended trial's
runs and the marks of checkpoints deleted after its process ended (``_setup``).

May import: errors, _info, config, core.store, core.channel
"""

from determined_trials.core.trackers._forwarder import Outcome, TrackerForwarder
from determined_trials.core.trackers._helper import TrackerHelper, start_tracker_helper
from determined_trials.core.trackers._setup import (
    TrialFacts,
    check_trackers,
    fork_parent_runs,
    mark_deleted_checkpoints,
    open_forwarder,
    settle_trial_runs,
    tensorboard_dir,
)

__all__ = ["Outcome", "TrackerForwarder", "TrackerHelper", "TrialFacts", "check_trackers", "fork_parent_runs",
           "mark_deleted_checkpoints", "open_forwarder", "settle_trial_runs", "start_tracker_helper",
           "tensorboard_dir"]
