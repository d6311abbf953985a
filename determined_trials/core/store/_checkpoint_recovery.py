"""Settle what a killed checkpoint writer left: pending store rows and staging folders.

A checkpoint is recorded PENDING before anything is staged, published (every file fsynced, then one
rename; S3: metadata.json uploaded last), then recorded COMPLETED. After a crash, a pending
checkpoint that was published is recorded complete; one that was not is removed with its staging
files.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from determined_trials.core.storage import StorageManager
from determined_trials.core.store._owner import owner_alive
from determined_trials.core.store._states import RunState

if TYPE_CHECKING:
    from determined_trials.core.store._local import LocalStore
    from determined_trials.core.store._trial_store import TrialStore

__all__ = ["STALE_STAGING_S", "recover_checkpoints", "recover_run_checkpoints", "remove_stale_staging"]

logger = logging.getLogger("determined_trials.core")

STALE_STAGING_S = 3600.0
"""Staging folders no live writer touched for this long are removed at start-up (orphans of crashes)."""


def recover_checkpoints(store: TrialStore, storage: StorageManager, trial_id: int) -> tuple[list[str], list[str]]:
    """Settle ``trial_id``'s pending checkpoints (no writer of that trial may be running).

    Returns ``(completed, removed)``: the uuids now recorded as complete, and those deleted.
    """
    return _settle(store, storage, trial_id, store.pending_checkpoints(trial_id))


def recover_run_checkpoints(store: LocalStore, storage: StorageManager) -> tuple[list[str], list[str]]:
    """Settle the pending checkpoints in ``storage`` of every trial of the run folder that no live process
    can still be writing: its experiment is not ACTIVE, or its owner (runner or script) is gone. A process
    killed between publishing and recording leaves a complete folder that this lists (and an unpublished
    one that it removes), whichever trial starts next. Returns ``(completed, removed)`` as
    ``recover_checkpoints``."""
    by_trial: dict[int, list[str]] = {}
    running: dict[int, bool] = {}
    for uuid, trial_id, experiment_id in store.pending_checkpoints_in(str(storage)):
        if experiment_id not in running:
            running[experiment_id] = _may_be_writing(store, experiment_id)
        if not running[experiment_id]:
            by_trial.setdefault(trial_id, []).append(uuid)
    completed: list[str] = []
    removed: list[str] = []
    for trial_id, uuids in by_trial.items():
        done, gone = _settle(store, storage, trial_id, uuids)
        completed += done
        removed += gone
    return completed, removed


def _may_be_writing(store: LocalStore, experiment_id: int) -> bool:
    """Whether a process of the experiment may still be writing checkpoints: it is ACTIVE and its owner lives."""
    if store.experiment(experiment_id).state != RunState.ACTIVE:
        return False
    owner = store.experiment_owner(experiment_id)
    return owner is not None and owner_alive(*owner)


def _settle(store: TrialStore, storage: StorageManager, trial_id: int, uuids: list[str]) -> tuple[list[str], list[str]]:
    completed: list[str] = []
    removed: list[str] = []
    for uuid in uuids:
        if storage.exists(uuid):
            metadata = storage.read_metadata(uuid)
            store.add_checkpoint(
                uuid=uuid, trial_id=trial_id, steps_completed=int(metadata["steps_completed"]),
                metadata=metadata, resources=storage.list_files(uuid), storage=str(storage),
            )
            completed.append(uuid)
            logger.warning("checkpoint %s was published but not recorded before a crash: recorded it now", uuid)
        else:
            storage.delete(uuid)
            store.drop_pending_checkpoint(uuid)
            removed.append(uuid)
            logger.info("removed checkpoint %s, whose writer died before publishing it", uuid)
    return completed, removed


def remove_stale_staging(storage: StorageManager, older_than_s: float = STALE_STAGING_S) -> list[str]:
    """Remove staging folders of crashed writers (storages that stage in place; others: nothing)."""
    removed = storage.remove_stale_staging(older_than_s)
    if removed:
        logger.info("removed %d stale checkpoint staging folder(s) from %s", len(removed), storage)
    return removed
