"""The local store: the SQLite database that plays the cluster master's part.

Owns the schema (``_schema``), ``LocalStore`` (``_local``) and its writes (``_run_writes``: experiments and
trials; ``_result_writes``: metrics and checkpoints) over one connection per process (``_connection``), the
reads and their record types (``_reads``, ``_records``), training reports held and stored a second at a time
(``_report_buffer``), experiment owners (``_owner``: pid + start time), settling checkpoints a killed writer left
(``_checkpoint_recovery``) and the checkpoint retention policy that the runner and a plain ``fit`` share
(``_retention``), each trial's time parts (``_trial_time``: where its wall time went), and the
states it records (``_states``: ``RunState`` of experiments and trials, ``CheckpointState``; both
re-exported here for the rooms above), and the contract of a trial process's store calls (``_trial_store``:
``TrialStore``, which ``LocalStore`` and the store channel's client implement).

``core.storage`` to delete and settle checkpoint folders. Never ``core.transport`` or ``core.channel`` (the
network sits above the store), nor any framework.

May import: errors, config, core.storage
"""

from determined_trials.core.store._checkpoint_recovery import (
    recover_checkpoints,
    recover_run_checkpoints,
    remove_stale_staging,
)
from determined_trials.core.store._local import STORE_FILENAME, LocalStore
from determined_trials.core.store._owner import claim_experiment, owner_alive, release_dead_owners
from determined_trials.core.store._records import (
    CheckpointRecord,
    Experiment,
    MetricRecord,
    NotFoundError,
    SearcherOpRecord,
    Trial,
    dumps,
)
from determined_trials.core.store._report_buffer import DisplayFields, HeldTime, ReportBuffer
from determined_trials.core.store._retention import (
    RetentionPolicy,
    checkpoint_scores,
    collect_bare_trial_garbage,
    collect_garbage,
    kept_checkpoints,
)
from determined_trials.core.store._states import CheckpointState, RunState
from determined_trials.core.store._trial_store import TRIAL_STORE_METHODS, TrialStore
from determined_trials.core.store._trial_time import SPAWNED_AT_ENV, TIME_PARTS, summed_time, time_breakdown

__all__ = [
    "SPAWNED_AT_ENV",
    "TIME_PARTS",
    "TRIAL_STORE_METHODS",
    "TrialStore",
    "SearcherOpRecord",
    "CheckpointState",
    "RunState",
    "CheckpointRecord",
    "DisplayFields",
    "Experiment",
    "HeldTime",
    "LocalStore",
    "MetricRecord",
    "NotFoundError",
    "ReportBuffer",
    "RetentionPolicy",
    "STORE_FILENAME",
    "Trial",
    "checkpoint_scores",
    "claim_experiment",
    "collect_bare_trial_garbage",
    "collect_garbage",
    "dumps",
    "kept_checkpoints",
    "owner_alive",
    "recover_checkpoints",
    "recover_run_checkpoints",
    "release_dead_owners",
    "remove_stale_staging",
    "summed_time",
    "time_breakdown",
]
