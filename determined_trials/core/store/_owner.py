"""Who runs an experiment: the owning process (pid + start time, so a reused pid is not mistaken for
it), and releasing experiments whose owner died without recording an end (``kill -9``, OOM)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import psutil

from determined_trials.core.store._states import RunState

if TYPE_CHECKING:
    from determined_trials.core.store._local import LocalStore

__all__ = ["claim_experiment", "owner_alive", "release_dead_owners"]

_SAME_START_S = 0.5  # psutil's start times of one process agree far better than this


def claim_experiment(store: LocalStore, experiment_id: int) -> None:
    """Record this process as the experiment's owner."""
    me = psutil.Process()
    store.set_experiment_owner(experiment_id, me.pid, me.create_time())


def owner_alive(pid: int, started: float) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs (a zombie does not)."""
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < _SAME_START_S and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def release_dead_owners(store: LocalStore) -> list[int]:
    """Mark ACTIVE experiments whose owner died, and their unfinished trials, PAUSED (resumable:
    from their latest checkpoints); returns their ids."""
    released = []
    for exp in store.experiments():
        owner = store.experiment_owner(exp.id) if exp.state == RunState.ACTIVE else None
        if owner is None or owner_alive(*owner):
            continue
        if exp.model_dir is not None:
            how = f"resume it with `det-trials experiment continue {exp.id}`"
        else:
            how = 'resume it with Trainer.fit(latest_checkpoint="latest") (or core.checkpoint.restore_path)'
        reason = f"its process (pid {owner[0]}) ended without recording an end (killed?); {how}"
        queued = {w.get("trial_id") for w in (exp.searcher_state or {}).get("queue", [])}
        for trial in store.trials(exp.id):
            # ACTIVE ones, and those the runner would start again (a trial that lost its runner
            # mid-write may have recorded its own ERROR: the runner had not counted it)
            if trial.state == RunState.ACTIVE or trial.id in queued:
                store.set_trial_state(trial.id, RunState.PAUSED, reason)
        store.set_experiment_state(exp.id, RunState.PAUSED, reason)
        released.append(exp.id)
    return released
