"""Experiment trackers (MLflow, Weights & Biases): one tracker run per trial, resumed by every later attempt of
the trial, fed from the store by a background forwarder on the chief rank (``_forwarder``) with each metric row as it
is stored and no step twice (``_progress``); the runs' clients (``_mlflow``, ``_wandb``: imported lazily, only when
configured) and the checks made before any trial runs (``_setup``).

May import: errors, _info, config, core.store
"""

from determined_trials.core.trackers._forwarder import Outcome, TrackerForwarder
from determined_trials.core.trackers._setup import (
    TrialFacts,
    check_trackers,
    fork_parent_runs,
    open_forwarder,
    settle_trial_runs,
)

__all__ = ["Outcome", "TrackerForwarder", "TrialFacts", "check_trackers", "fork_parent_runs", "open_forwarder",
           "settle_trial_runs"]
