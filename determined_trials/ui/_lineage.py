"""Where a trial or an experiment came from, for the dashboard's links back: the trial a fork (or a PBT child)
continues, the checkpoint a warm start (``searcher.source_trial_id`` / ``source_checkpoint_uuid``) starts every
trial from, and the earlier experiments an optuna study was told (``searcher.warm_start``)."""

from __future__ import annotations

from typing import Any

from determined_trials.core.store import Experiment, LocalStore, NotFoundError, Trial

__all__ = ["experiment_origins", "trial_origin"]


def _experiment_of(store: LocalStore, trial_id: int | None) -> int | None:
    """The experiment of trial ``trial_id`` (None: no trial, or one no longer in the store)."""
    if trial_id is None:
        return None
    try:
        return store.trial(trial_id).experiment_id
    except NotFoundError:
        return None


def _warm_start(store: LocalStore, exp: Experiment) -> dict[str, Any] | None:
    """The checkpoint every trial of a warm-started experiment starts from (as its runner resolved it)."""
    warm = (exp.searcher_state or {}).get("warm_start")
    if not warm:
        return None
    return {"kind": "warm_start", "trial_id": warm.get("trial_id"), "checkpoint": warm.get("checkpoint"),
            "experiment_id": _experiment_of(store, warm.get("trial_id"))}


def trial_origin(store: LocalStore, trial: Trial, exp: Experiment) -> dict[str, Any] | None:
    """``{"kind": "fork" | "pbt" | "warm_start", "trial_id", "experiment_id", "checkpoint"}``: what the trial
    started from (its parent's checkpoint, or its experiment's warm start), else None."""
    if trial.parent_trial_id is not None:
        return {"kind": "fork" if trial.search_round is None else "pbt", "trial_id": trial.parent_trial_id,
                "checkpoint": trial.parent_checkpoint,
                "experiment_id": _experiment_of(store, trial.parent_trial_id)}
    return _warm_start(store, exp)


def experiment_origins(store: LocalStore, exp: Experiment, trials: list[Trial]) -> list[dict[str, Any]]:
    """What the experiment started from: a fork's parent trial (``kind: fork``), the warm-start checkpoint of its
    trials (``warm_start``) and the earlier experiments its optuna study was told (``study``, with
    ``experiments``)."""
    origins = []
    forked = next((t for t in trials if t.parent_trial_id is not None and t.search_round is None), None)
    if forked is not None:
        origins.append(trial_origin(store, forked, exp))
    warm = _warm_start(store, exp)
    if warm is not None:
        origins.append(warm)
    searcher = exp.config.get("searcher") or {}
    earlier = (searcher.get("warm_start") or {}).get("experiments") if searcher.get("name") == "optuna" else None
    if earlier:
        origins.append({"kind": "study", "experiments": [int(e) for e in dict.fromkeys(earlier)]})
    return [o for o in origins if o is not None]
