"""What ``experiment describe`` and ``trial describe`` say about the search: the best trial and its
hyperparameters (every searcher), and PBT's lineage (each trial's parent, the checkpoint it started from,
the round it started in)."""

from __future__ import annotations

from typing import Any, TextIO

from determined_trials._format import Column, flat_hparams, table, text
from determined_trials.core.store import Experiment, LocalStore, Trial

__all__ = ["best_trial", "best_trial_line", "lineage_pairs", "write_lineage"]

_LINEAGE_COLUMNS = [
    Column("round", "ROUND"),
    Column("trial", "TRIAL"),
    Column("parent", "PARENT"),
    Column("parent_checkpoint", "PARENT CHECKPOINT"),
    Column("state", "STATE"),
    Column("best", "BEST"),
]


def _searcher(exp: Experiment) -> tuple[str | None, bool]:
    raw = exp.config.get("searcher")
    searcher: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return searcher.get("metric"), bool(searcher.get("smaller_is_better", True))


def best_trial(store: LocalStore, exp: Experiment) -> dict[str, Any] | None:
    """The trial with the best validation value of the searcher metric: ``{"trial_id", "metric", "value",
    "hparams"}`` (ties: the earlier trial), or None before any validation reported it."""
    metric, smaller = _searcher(exp)
    if not metric:
        return None
    best = store.best_by_trial(exp.id, metric, smaller)
    if not best:
        return None
    trial_id = min(best, key=lambda tid: (best[tid] if smaller else -best[tid], tid))
    return {"trial_id": trial_id, "metric": metric, "value": best[trial_id],
            "hparams": store.trial(trial_id).hparams}


def best_trial_line(store: LocalStore, exp: Experiment) -> str:
    """``experiment describe``'s "best trial" line ("" before there is one)."""
    best = best_trial(store, exp)
    if best is None:
        return ""
    hparams = " ".join(flat_hparams(best["hparams"]))
    return f"{best['trial_id']} ({best['metric']} = {text(best['value'])}): {hparams}"


def lineage_pairs(trial: Trial, store: LocalStore) -> list[tuple[str, str | None]]:
    """``trial describe``'s lineage lines: PBT's, or the trial a fork continues (none for other trials)."""
    if trial.search_round is None:
        if trial.parent_trial_id is None and trial.parent_checkpoint is not None:  # another run folder's checkpoint
            origin = store.checkpoint(trial.parent_checkpoint).metadata.get("forked_from") or {}
            return [("forked from", f"trial {origin.get('trial_id')} (experiment {origin.get('experiment_id')}) of "
                                    f"run folder {origin.get('run_dir')}, continuing its checkpoint "
                                    f"{trial.parent_checkpoint} (copied here)")]
        forked = f"trial {trial.parent_trial_id}, continuing its checkpoint {trial.parent_checkpoint}"
        return [] if trial.parent_trial_id is None else [("forked from", forked)]
    parent = None
    if trial.parent_trial_id is not None:
        parent = f"trial {trial.parent_trial_id}, from its checkpoint {trial.parent_checkpoint}"
    return [("search round", str(trial.search_round)), ("parent", parent or "none (first population)")]


def write_lineage(out: TextIO, store: LocalStore, exp: Experiment, trials: list[Trial], fit: int | None) -> None:
    """PBT's lineage, a table ordered by the round each trial started in (nothing for other searchers)."""
    if not any(t.search_round is not None for t in trials):
        return
    metric, smaller = _searcher(exp)
    best = store.best_by_trial(exp.id, metric, smaller) if metric else {}
    ordered = sorted(trials, key=lambda t: (t.search_round or 0, t.id))
    rows = [[t.search_round, t.id, t.parent_trial_id, t.parent_checkpoint, t.state, best.get(t.id)] for t in ordered]
    out.write(f"\nLineage (PBT: the round each trial started in, the trial and checkpoint it continued; "
              f"BEST: its best {metric}):\n")
    out.write(table(_LINEAGE_COLUMNS, rows, fit=fit, squeeze=("parent_checkpoint",)))
