"""The optuna searcher's parameter importances for the experiment page: Optuna's `get_param_importances` of the
study recorded in the experiment's saved searcher state, computed again only when more trials completed."""

from __future__ import annotations

import threading
from typing import Any

from determined_trials.core.store import Experiment

__all__ = ["param_importances"]

_LOCK = threading.Lock()
_CACHE: dict[tuple[str, int], tuple[int, dict[str, float] | None]] = {}  # (run folder, id) -> (completed, found)


def param_importances(exp: Experiment) -> dict[str, float] | None:
    """Name -> importance (largest first) for an optuna experiment with >= 10 completed trials, else None."""
    searcher = exp.config.get("searcher")
    if not isinstance(searcher, dict) or searcher.get("name") != "optuna":
        return None
    record = ((exp.searcher_state or {}).get("searcher") or {}).get("study")
    if not isinstance(record, dict):
        return None
    from determined_trials.searcher import param_importances as importances_of

    completed = sum(part.get("state") == "COMPLETE" for part in record.get("trials", ()))
    key = (str(exp.model_dir), exp.id)
    with _LOCK:
        cached = _CACHE.get(key)
        if cached is not None and cached[0] == completed:
            return cached[1]
        try:
            found: Any = importances_of(record)
        except Exception:  # a record Optuna cannot rank (yet): nothing to show now
            return None
        _CACHE[key] = (completed, found)
        return found
