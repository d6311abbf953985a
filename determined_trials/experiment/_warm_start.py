"""Determined's warm start at ``experiment create``: ``searcher.source_trial_id`` (that trial's latest
checkpoint) or ``searcher.source_checkpoint_uuid`` resolved, once, to the checkpoint whose model weights every
trial of the experiment starts from; an unknown trial or checkpoint is a ``ConfigError`` before any trial runs."""

from __future__ import annotations

import dataclasses

from determined_trials.config import ExperimentConfig
from determined_trials.core.storage import StorageManager
from determined_trials.core.store import CheckpointState, LocalStore, NotFoundError
from determined_trials.errors import ConfigError

__all__ = ["WarmStart", "resolve_warm_start"]

_LIST = "`det-trials checkpoint list` shows the run folder's checkpoints"


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """The checkpoint every trial of the experiment starts from, and the trial that wrote it (None: a checkpoint
    of another run folder)."""

    checkpoint: str
    trial_id: int | None


def resolve_warm_start(config: ExperimentConfig, store: LocalStore, storage: StorageManager) -> WarmStart | None:
    """The checkpoint the experiment's trials start from, or None without a warm start. With both
    keys ``source_trial_id`` wins (Determined's rule). The checkpoint must be complete in the experiment's own
    checkpoint storage, which its trials read it from."""
    searcher = config.searcher
    if searcher.source_trial_id is not None:
        uuid = _latest_of_trial(store, searcher.source_trial_id)
        key = f"searcher.source_trial_id {searcher.source_trial_id}: its latest checkpoint {uuid}"
    elif searcher.source_checkpoint_uuid is not None:
        uuid = searcher.source_checkpoint_uuid
        _check_known(store, storage, uuid)
        key = f"searcher.source_checkpoint_uuid {uuid}"
    else:
        return None
    if not storage.exists(uuid):
        raise ConfigError(f"{key} is not in this experiment's checkpoint storage ({storage.describe()}), where its "
                          "trials read it: set checkpoint_storage to the storage that holds it")
    try:
        return WarmStart(uuid, store.checkpoint(uuid).trial_id)
    except NotFoundError:
        return WarmStart(uuid, None)


def _latest_of_trial(store: LocalStore, trial_id: int) -> str:
    try:
        store.trial(trial_id)
    except NotFoundError:
        raise ConfigError(f"searcher.source_trial_id: there is no trial {trial_id} in the run folder {store.path} "
                          "(`det-trials trial list` or `experiment describe` show the trials)") from None
    latest = store.latest_checkpoint(trial_id)
    if latest is None:
        raise ConfigError(f"searcher.source_trial_id: no checkpoint found for source trial {trial_id} (none written, "
                          f"or all deleted); name a checkpoint with searcher.source_checkpoint_uuid instead ({_LIST})")
    return latest.uuid


def _check_known(store: LocalStore, storage: StorageManager, uuid: str) -> None:
    """A checkpoint the run folder recorded must not be deleted; one it does not know (written elsewhere) must be
    in the storage."""
    try:
        record = store.checkpoint(uuid)
    except NotFoundError:
        if storage.exists(uuid):
            return
        raise ConfigError(f"searcher.source_checkpoint_uuid: checkpoint {uuid} not found, neither in the run folder "
                          f"{store.path} nor in the checkpoint storage ({storage.describe()}); {_LIST}") from None
    if record.state != CheckpointState.COMPLETED:
        raise ConfigError(f"searcher.source_checkpoint_uuid: checkpoint {uuid} (trial {record.trial_id}) is "
                          f"{record.state.lower()}: its files are gone; {_LIST}")
