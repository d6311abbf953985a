"""Checkpoint garbage collection: keep what ``save_experiment_best``, ``save_trial_best`` and
``save_trial_latest`` name, delete the rest of an ended trial's checkpoints from storage and the store."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable
from typing import Any

from determined_trials.core.storage import StorageManager
from determined_trials.core.store._checkpoint_recovery import recover_checkpoints
from determined_trials.core.store._local import CheckpointRecord, LocalStore

__all__ = ["RetentionPolicy", "checkpoint_scores", "collect_bare_trial_garbage", "collect_garbage", "kept_checkpoints"]

logger = logging.getLogger("determined_trials.experiment")


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    """How many checkpoints survive GC, and which metric ranks them."""

    metric: str
    smaller_is_better: bool = True
    save_experiment_best: int = 0
    save_trial_best: int = 1
    save_trial_latest: int = 1

    @classmethod
    def from_config(cls, config: Any) -> RetentionPolicy:
        """The policy of an ``ExperimentConfig`` (storage defaults when it names no storage mapping)."""
        storage = config.checkpoint_storage
        counts = {k: getattr(storage, k) for k in ("save_experiment_best", "save_trial_best", "save_trial_latest")
                  if hasattr(storage, k)}
        return cls(metric=config.searcher.metric, smaller_is_better=config.searcher.smaller_is_better, **counts)


def checkpoint_scores(store: LocalStore, checkpoints: Iterable[CheckpointRecord], metric: str) -> dict[str, float]:
    """uuid -> the searcher metric of the validation reported at the checkpoint's step count."""
    by_trial: dict[int, dict[int, float]] = {}
    scores: dict[str, float] = {}
    for ckpt in checkpoints:
        if ckpt.trial_id is None:
            continue
        if ckpt.trial_id not in by_trial:
            by_trial[ckpt.trial_id] = _validation_values(store, ckpt.trial_id, metric)
        value = by_trial[ckpt.trial_id].get(ckpt.steps_completed)
        if value is not None:
            scores[ckpt.uuid] = value
    return scores


def _validation_values(store: LocalStore, trial_id: int, metric: str) -> dict[int, float]:
    values: dict[int, float] = {}
    for record in store.metrics(trial_id, "validation"):
        value = record.metrics.get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            values[record.steps_completed] = float(value)
    return values


def _best(uuids: list[str], scores: dict[str, float], count: int, smaller: bool) -> list[str]:
    ranked = sorted((u for u in uuids if u in scores), key=lambda u: scores[u] if smaller else -scores[u])
    return ranked[:count]


def kept_checkpoints(
    store: LocalStore, experiment_id: int, trial_ids: Iterable[int], policy: RetentionPolicy
) -> set[str]:
    """The uuids among ``trial_ids``' checkpoints that the policy keeps (experiment best included)."""
    everything = store.checkpoints(experiment_id=experiment_id)
    scores = checkpoint_scores(store, everything, policy.metric)
    keep = set(_best([c.uuid for c in everything], scores, policy.save_experiment_best, policy.smaller_is_better))
    for trial_id in trial_ids:
        own = [c.uuid for c in everything if c.trial_id == trial_id]
        if policy.save_trial_latest:
            keep.update(own[-policy.save_trial_latest:])
        keep.update(_best(own, scores, policy.save_trial_best, policy.smaller_is_better))
    return keep


def collect_garbage(
    store: LocalStore, storage: StorageManager, experiment_id: int, trial_ids: Iterable[int],
    policy: RetentionPolicy, protect: Iterable[str] = (),
) -> list[str]:
    """Delete the checkpoints of ``trial_ids`` (ended trials) the policy does not keep, nor ``protect`` names
    (e.g. the checkpoint a PBT child is still to start from), nor a fork started from; returns their uuids."""
    ids = set(trial_ids)
    for trial_id in ids:  # ended trials: settle what a killed writer left before deciding what to keep
        recover_checkpoints(store, storage, trial_id)
    keep = kept_checkpoints(store, experiment_id, ids, policy) | set(protect) | store.forked_checkpoints()
    deleted = []
    for ckpt in store.checkpoints(experiment_id=experiment_id):
        if ckpt.trial_id in ids and ckpt.uuid not in keep:
            try:
                storage.delete(ckpt.uuid)
            except Exception as exc:  # a storage hiccup must not fail the experiment
                logger.warning("could not delete checkpoint %s from %s: %s", ckpt.uuid, storage, exc)
                continue
            store.mark_checkpoint_deleted(ckpt.uuid)
            deleted.append(ckpt.uuid)
    return deleted


def collect_bare_trial_garbage(core_context: Any, config: Any) -> list[str]:
    """After a plain script's fit completed (its trial ended): the runner's rules, on the chief only."""
    if core_context.distributed.get_rank() != 0:
        return []
    trial = core_context.info.trial
    return collect_garbage(core_context.store, core_context.checkpoint.storage, trial.experiment_id,
                           [trial.trial_id], RetentionPolicy.from_config(config))
