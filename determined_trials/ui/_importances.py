"""The optuna searcher's parameter importances for the experiment page: Optuna's `get_param_importances` of
the study file in the experiment's folder, computed again only when that file changed."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from determined_trials.core.store._local import Experiment

__all__ = ["param_importances"]

_LOCK = threading.Lock()
_CACHE: dict[Path, tuple[tuple[int, int], dict[str, float] | None]] = {}


def param_importances(exp: Experiment) -> dict[str, float] | None:
    """Name -> importance (largest first) for an optuna experiment with >= 10 completed trials, else None."""
    searcher = exp.config.get("searcher")
    if not isinstance(searcher, dict) or searcher.get("name") != "optuna" or exp.model_dir is None:
        return None
    from determined_trials.searcher import STUDY_FILE
    from determined_trials.searcher import param_importances as importances_of

    path = Path(exp.model_dir).parent / STUDY_FILE
    try:
        stat = path.stat()
    except OSError:
        return None
    key = (stat.st_mtime_ns, stat.st_size)
    with _LOCK:
        cached = _CACHE.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            found: Any = importances_of(path)
        except Exception:  # a study being written, or one Optuna cannot rank yet: nothing to show now
            return None
        _CACHE[path] = (key, found)
        return found
