"""What progress means, in one place: a trial's (what it trained over the most it trains) and an experiment's (its
planned trials' progress, summed, over how many trials its searcher runs), both never going back while it runs."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

from determined_trials.config import grid_points
from determined_trials.core.store import RunState

__all__ = ["DONE_STATES", "experiment_progress", "planned_trials", "trial_progress"]

DONE_STATES = frozenset({RunState.COMPLETED, RunState.ERROR})  # finished for good: the searcher runs it no more


def trial_progress(trained: float, full: float) -> float:
    """A trial's progress: ``trained`` over ``full``, the most the trial trains (the searcher's ``max_length``, or
    the longest operation it was handed), in the same units; in [0, 1]. Under ASHA a promoted trial goes on from
    where it was: the fraction never goes back."""
    return min(max(float(trained), 0.0) / max(float(full), 1.0), 1.0)


def planned_trials(config: Mapping[str, Any]) -> int | None:
    """How many trials the experiment's searcher runs (``single``: 1, ``random`` and ``adaptive_asha``:
    ``max_trials``, ``grid``: the grid's points, ``pbt``: its population and children), or None when the
    config does not say."""
    searcher = config.get("searcher")
    if not isinstance(searcher, Mapping):
        return None
    name = searcher.get("name")
    if name == "single":
        return 1
    if name == "grid":
        return _grid_size(json.dumps(config.get("hyperparameters") or {}, sort_keys=True, default=str))
    if name == "pbt":
        return _pbt_trials(searcher)
    count = searcher.get("max_trials")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None


def _pbt_trials(searcher: Mapping[str, Any]) -> int | None:
    """PBT's trials: the first population plus floor(truncate_fraction × population) children a round after it."""
    try:
        size, rounds = int(searcher["population_size"]), int(searcher["num_rounds"])
        replaced = int(float(searcher["replace_function"]["truncate_fraction"]) * size + 1e-9)
    except (KeyError, TypeError, ValueError):
        return None
    return size + (rounds - 1) * replaced


@functools.lru_cache(maxsize=64)
def _grid_size(space: str) -> int | None:
    """The number of points of the grid (given as JSON, so a page's every poll counts it once)."""
    try:
        return len(grid_points(json.loads(space)))
    except Exception:  # noqa: BLE001 - a space the runner would have refused: the trials made are the plan
        return None


def experiment_progress(trials: Iterable[tuple[str, float | None]], planned: int | None) -> float | None:
    """An experiment's progress from its trials' (state, progress): the sum over its trials of each one's progress
    (a COMPLETED or ERROR trial counts 1) over the number of trials its searcher runs (``planned``; at least those
    made so far); trials not made yet count 0. While the experiment runs it never goes back: a trial made adds 0,
    a trial's progress only grows, a finished trial counts 1. None when there is no trial and no plan."""
    done = [1.0 if state in DONE_STATES else min(max(progress or 0.0, 0.0), 1.0) for state, progress in trials]
    total = max(planned or 0, len(done))
    return sum(done) / total if total else None
