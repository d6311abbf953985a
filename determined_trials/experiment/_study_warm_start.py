"""An optuna search's ``searcher.warm_start`` at ``experiment create``: the completed trials of earlier experiments
in the run folder, each with the new search's metric as a search reads it, told to the new study before its first
suggestion; an unknown experiment id is a ``ConfigError`` before anything is recorded."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeGuard

from determined_trials.config import ExperimentConfig, OptunaSearcher
from determined_trials.core.store import LocalStore, NotFoundError, RunState, Trial
from determined_trials.errors import ConfigError

__all__ = ["EarlierTrials", "earlier_trials", "tell_earlier_trials"]


@dataclasses.dataclass(frozen=True)
class EarlierTrials:
    """What the earlier experiments give the new study: (label, hyperparameters, searcher metric) per completed
    trial, "trial N: why" for a completed trial without a usable metric, and the experiments' ids."""

    found: list[tuple[str, dict[str, Any], float]]
    skipped: list[str]
    experiments: list[int]


def earlier_trials(config: ExperimentConfig, store: LocalStore) -> EarlierTrials | None:
    """The completed trials of ``searcher.warm_start.experiments`` (each id once), with their metric; None without
    a warm start. Trials that did not complete (failed, canceled, still paused) are left out: they have no result
    to tell."""
    searcher = config.searcher
    if not isinstance(searcher, OptunaSearcher) or searcher.warm_start is None:
        return None
    for experiment_id in searcher.warm_start.experiments:
        try:
            store.experiment(experiment_id)
        except NotFoundError:
            raise ConfigError(f"searcher.warm_start.experiments: there is no experiment {experiment_id} in the run "
                              f"folder {store.path} (`det-trials experiment list` shows them)") from None
    warm = EarlierTrials([], [], list(dict.fromkeys(searcher.warm_start.experiments)))
    for experiment_id in warm.experiments:
        earlier = store.experiment(experiment_id).config.get("searcher") or {}
        same_metric = earlier.get("metric") == searcher.metric
        trials = [t for t in store.trials(experiment_id) if t.state == RunState.COMPLETED]
        full = max((op.length for t in trials for op in store.searcher_ops(t.id) if op.completed), default=None)
        for trial in trials:
            value, why = _metric(store, trial, searcher.metric, same_metric, full)
            if value is None:
                warm.skipped.append(f"trial {trial.id}: {why}")
            else:
                warm.found.append((f"trial {trial.id}", trial.hparams, value))
    return warm


def _metric(store: LocalStore, trial: Trial, metric: str, same_metric: bool,
            full: int | None) -> tuple[float | None, str]:
    """The trial's searcher metric as its search read it: its last completed searcher operation's (when that search
    had the same metric), else its latest validation of ``metric``; (None, why) for a trial that exited early or was
    stopped short of its experiment's full length (an early stop by its search: its value is of a shorter run)."""
    if trial.early_exit_reason:
        return None, f"it exited early ({trial.early_exit_reason})"
    done = [op for op in store.searcher_ops(trial.id) if op.completed and op.metric is not None]
    if done and full is not None and done[-1].length < full:
        return None, f"its search stopped it at length {done[-1].length} of {full}"
    if same_metric and done and _finite(done[-1].metric):
        return done[-1].metric, ""
    values = [r.metrics.get(metric) for r in store.metrics(trial.id, "validation")]
    numbers = [float(v) for v in values if _finite(v)]
    if numbers:
        return numbers[-1], ""
    return None, f"it has no validation of {metric!r}"


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def tell_earlier_trials(searcher: Any, warm: EarlierTrials) -> str:
    """Add the earlier trials to the optuna ``searcher``'s study (``OptunaSearch.tell_earlier``); the one line that
    says what it holds and what was skipped (how many, and the first reason)."""
    added, misfits = searcher.tell_earlier(warm.found)
    skipped = warm.skipped + misfits
    names = ", ".join(str(e) for e in warm.experiments)
    line = f"searcher.warm_start: the study starts with {added} trial(s) of experiment(s) {names}"
    if skipped:
        line += (f"; {len(skipped)} skipped, the first as {skipped[0]} (hyperparameters must fit this search "
                 "space, values must be those of a completed trial)")
    return line
