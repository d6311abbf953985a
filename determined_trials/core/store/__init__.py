"""The local store: the SQLite database that plays the cluster master's part.

Owns the schema (``_schema``), ``LocalStore`` (``_local``) and its writes (``_run_writes``: experiments and
trials; ``_result_writes``: metrics and checkpoints) over one connection per process (``_connection``), the
reads and their record types (``_reads``, ``_records``), training reports held and stored a second at a time
(``_report_buffer``), experiment owners (``_owner``: pid + start time), settling checkpoints a killed writer left
(``_checkpoint_recovery``) and the checkpoint retention policy that the runner and a plain ``fit`` share
(``_retention``), and the states it records (``_states``: ``RunState`` of experiments and
trials, ``CheckpointState``; both re-exported here for the rooms above), and the contract of a trial process's
store calls (``_trial_store``: ``TrialStore``, which ``LocalStore`` and the store channel's client implement).

``core.storage`` to delete and settle checkpoint folders. Never ``core.transport`` or ``core.channel`` (the
network sits above the store), nor any framework.

May import: errors, config, core.storage
"""

from determined_trials.core.store._states import CheckpointState, RunState
from determined_trials.core.store._trial_store import TRIAL_STORE_METHODS, TrialStore

__all__ = ["TRIAL_STORE_METHODS", "CheckpointState", "RunState", "TrialStore"]
