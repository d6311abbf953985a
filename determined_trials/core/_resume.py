"""Resuming: which checkpoint "latest" means, continuing the trial it belongs to, and the trial's one timeline.

A plain script registers a fresh one-trial experiment in ``core.init()``; when it then resumes from
a checkpoint of an earlier run before its own trial is settled (in ``init`` or a trainer's ``fit``, before
anything used the trial), that empty registration is dropped and the context is settled as the earlier
trial (its metrics history, best-so-far and searcher progress stay one trial's). Whenever a trial's process
starts from a checkpoint (or, launched again, from scratch), what lost attempts reported after it is
superseded (``resume_timeline``).
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Protocol

from determined_trials._info import TrialInfo
from determined_trials.core.channel import own_store
from determined_trials.core.store import NotFoundError, RunState, TrialStore, claim_experiment

if TYPE_CHECKING:
    from determined_trials._info import ClusterInfo
    from determined_trials.core._distributed import DistributedContext
    from determined_trials.core.store import LocalStore


class Context(Protocol):
    """What resuming needs of the Core API ``Context`` (which calls this module from ``core.init``)."""

    distributed: DistributedContext
    store: TrialStore

    @property
    def info(self) -> ClusterInfo: ...

    @property
    def _trial_settled(self) -> bool: ...

    def peek_trial(self) -> TrialInfo: ...

    def _settle(self, trial: TrialInfo, latest_checkpoint: str | None) -> None: ...

    def _restart_timeline(self, steps_completed: int | None) -> None: ...


__all__ = ["LATEST", "continue_bare_run", "resolve_latest", "resume_bare_trial", "resume_timeline"]

logger = logging.getLogger("determined_trials.core")

LATEST = "latest"
"""The checkpoint name that means the newest checkpoint (``resolve_latest`` says which)."""


def resolve_latest(store: LocalStore, trial: TrialInfo | None = None) -> str | None:
    """The uuid "latest" names, or ``None`` when there is none: the newest checkpoint in the run folder; for
    a plain script's ``trial``, the newest of an earlier plain-script run with this run's experiment name
    (its ``name`` in the config, else the script's name) or of ``trial`` itself."""
    found = store.checkpoints()
    if trial is not None:
        name = store.experiment(trial.experiment_id).name
        same_name = {e.id for e in store.experiments()
                     if e.name == name and e.model_dir is None and e.id != trial.experiment_id}
        found = [c for c in found if c.experiment_id in same_name or c.trial_id == trial.trial_id]
    return found[-1].uuid if found else None


def continue_bare_run(context: Context, wanted: str | None) -> str | None:
    """The checkpoint a plain script resumes from: ``wanted`` (a uuid, or ``LATEST``: the newest checkpoint
    of an earlier run with this run's experiment name, None when there is none). The context is settled
    as the trial that goes on (``resume_bare_trial``), with ``info.latest_checkpoint`` naming the checkpoint,
    and the chief says so on stderr. Every rank calls this."""
    dist = context.distributed
    uuid = wanted
    if wanted == LATEST:
        uuid = resolve_latest(own_store(context.store), context.peek_trial()) if dist.get_rank() == 0 else None
        if dist.get_size() > 1:
            uuid = dist.broadcast(uuid)
        if uuid is None:  # reading info settles this run's own trial
            _say(context, f"no checkpoint to resume from in {context.info.run_dir}: trial "
                          f"{context.info.trial.trial_id} starts from scratch")
    if uuid is None:
        return None
    context._settle(resume_bare_trial(context, uuid), uuid)
    steps = _steps_of(context, uuid) if dist.get_rank() == 0 else None
    if steps is not None:
        resume_timeline(context, steps)
    after = "" if steps is None else f" (after batch {steps})"
    _say(context, f"resuming trial {context.info.trial.trial_id} from checkpoint {uuid}{after}")
    return uuid


def resume_timeline(context: Context, steps_completed: int | None) -> None:
    """The trial goes on from its checkpoint at ``steps_completed`` (None: it starts over, without one),
    in this process: the reports of lost attempts after that step are marked superseded in the store and
    dropped by TensorBoard, so that every read shows each step once. The chief does it (others return)."""
    if context.distributed.get_rank() == 0:
        context._restart_timeline(steps_completed)


def _say(context: Context, line: str) -> None:
    if context.distributed.get_rank() == 0:
        print(f"det-trials: {line}", file=sys.stderr, flush=True)


def _steps_of(context: Context, storage_id: str) -> int | None:
    """The batches trained at checkpoint ``storage_id``; None when this run folder does not hold it (the
    script resumes another folder's checkpoint as this run's own new trial: nothing to supersede)."""
    try:
        return own_store(context.store).checkpoint(storage_id).steps_completed
    except NotFoundError:
        return None


def resume_bare_trial(context: Context, storage_id: str) -> TrialInfo:
    """The trial that goes on from ``storage_id``: the trial that wrote it, in place of the one this run
    registered, while no rank has settled this run's trial and the hyperparameters agree; else this run's
    (every rank calls this)."""
    dist = context.distributed
    settled = context._trial_settled
    if dist.get_size() > 1:
        settled = any(dist.allgather(settled))
    adopted: TrialInfo | None = None
    if dist.get_rank() == 0:
        adopted = _adoptable(context, storage_id, settled)
        if adopted is not None:
            store, mine = own_store(context.store), context.peek_trial()
            store.delete_experiment(mine.experiment_id)
            store.set_trial_state(adopted.trial_id, RunState.ACTIVE)
            store.set_experiment_state(adopted.experiment_id, RunState.ACTIVE)
            claim_experiment(store, adopted.experiment_id)  # ours now, not the earlier (dead) run's
    if dist.get_size() > 1:
        adopted = dist.broadcast(adopted)
    return adopted if adopted is not None else context.peek_trial()


def _adoptable(context: Context, storage_id: str, settled: bool) -> TrialInfo | None:
    store, mine = own_store(context.store), context.peek_trial()
    try:
        owner_id = store.checkpoint(storage_id).trial_id
    except NotFoundError:
        return None
    if owner_id is None or owner_id == mine.trial_id:
        return None
    owner = store.trial(owner_id)
    if store.experiment(owner.experiment_id).model_dir is not None:
        return None  # a trial of `det-trials experiment create`: that runner owns it
    if owner.hparams != mine.hparams:
        logger.warning("checkpoint %s is from trial %d with other hyperparameters (%s); recording this "
                       "run as trial %d", storage_id, owner_id, owner.hparams, mine.trial_id)
        return None
    if settled:
        logger.warning("checkpoint %s is from trial %d, but this run had already used its own trial %d (its id, "
                       "seed, TensorBoard folder or reports) before resuming; recording this run as trial %d",
                       storage_id, owner_id, mine.trial_id, mine.trial_id)
        return None
    return TrialInfo(trial_id=owner.id, experiment_id=owner.experiment_id, trial_seed=owner.seed,
                     hparams=owner.hparams, config=mine.config)
