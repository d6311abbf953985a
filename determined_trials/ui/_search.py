"""The dashboard's view of a search (``/api/v1/experiments/{id}/search``): the best-so-far of the searcher
metric against trial number (every searcher) and PBT's lineage (each trial's round, parent and starting
checkpoint). Reads only."""

from __future__ import annotations

from typing import Any

from determined_trials.core.store import LocalStore, Trial
from determined_trials.ui._data import clean

__all__ = ["search_view"]


def _best_so_far(trials: list[Trial], best: dict[int, float], smaller: bool) -> list[dict[str, Any]]:
    """One point per trial with a value, in creation order: its number (from 1), its best, the best so far."""
    points: list[dict[str, Any]] = []
    running: float | None = None
    for number, trial in enumerate(trials, start=1):
        value = best.get(trial.id)
        if value is None:
            continue
        if running is None or (value < running if smaller else value > running):
            running = value
        points.append({"trial_id": trial.id, "number": number, "value": value, "best": running})
    return points


def _lineage(trials: list[Trial], best: dict[int, float]) -> list[dict[str, Any]]:
    """PBT's trials by the round they started in (empty for other searchers)."""
    if not any(t.search_round is not None for t in trials):
        return []
    ordered = sorted(trials, key=lambda t: (t.search_round or 0, t.id))
    return [{"round": t.search_round, "trial_id": t.id, "parent_trial_id": t.parent_trial_id,
             "parent_checkpoint": t.parent_checkpoint, "state": t.state, "best_metric": best.get(t.id),
             "hparams": t.hparams} for t in ordered]


def search_view(store: LocalStore, experiment_id: int) -> dict[str, Any]:
    """``{"metric", "smaller_is_better", "best_so_far": [...], "lineage": [...]}`` for the experiment."""
    exp = store.experiment(experiment_id)
    raw = exp.config.get("searcher")
    searcher: dict[str, Any] = raw if isinstance(raw, dict) else {}
    metric, smaller = searcher.get("metric"), bool(searcher.get("smaller_is_better", True))
    trials = store.trials(exp.id)
    best = store.best_by_trial(exp.id, metric, smaller) if metric else {}
    return clean({"experiment_id": exp.id, "searcher": searcher.get("name"), "metric": metric,
                  "smaller_is_better": smaller, "best_so_far": _best_so_far(trials, best, smaller),
                  "lineage": _lineage(trials, best)})
