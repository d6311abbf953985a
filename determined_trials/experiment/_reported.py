"""The searcher metric of a trial that completed no searcher operation: Determined 0.38's searchers read
it from the trial's validation reports when the config has no ``searcher.max_length`` (a Core API script
that only reports validation metrics, ASHA by ``time_metric``)."""

from __future__ import annotations

import math
from typing import Any

from determined_trials.config import AdaptiveASHASearcher
from determined_trials.core.store import LocalStore

__all__ = ["expects_operations", "metric_from_validations", "missing_metric_reason"]


def expects_operations(searcher: Any) -> bool:
    """Whether trials are asked to complete searcher operations (``searcher.max_length`` is set): then a
    trial that completed none did not report the searcher metric."""
    return searcher.max_length is not None


def _time_metric(searcher: Any) -> str | None:
    """The metric that measures a trial's length instead of ``max_length`` (ASHA's ``time_metric``), or None."""
    return searcher.time_metric if isinstance(searcher, AdaptiveASHASearcher) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def metric_from_validations(store: LocalStore, trial_id: int, searcher: Any, length: int) -> float | None:
    """Without ``max_length``: the searcher metric of the first validation whose ``time_metric`` reached
    ``length`` (ASHA by time), or of the latest validation (every other searcher: one length); None when
    no validation has it (or ``max_length`` is set: operations carry the metric then)."""
    if expects_operations(searcher):
        return None
    time_metric = _time_metric(searcher)
    latest = None
    for record in store.metrics(trial_id, "validation"):
        value = _number(record.metrics.get(searcher.metric))
        if value is None:
            continue
        if time_metric is None:
            latest = value
            continue
        reached = _number(record.metrics.get(time_metric))
        if reached is not None and reached >= length:
            return value
    return latest


def missing_metric_reason(searcher: Any, length: int) -> str | None:
    """What a trial that exited 0 without the searcher metric failed to do, or None when nothing was
    expected of it (no ``max_length`` and no ``time_metric``: Determined 0.38 expects no report)."""
    if expects_operations(searcher):
        return f"exited without reporting the searcher metric for length {length}"
    time_metric = _time_metric(searcher)
    if time_metric is not None:
        return f"exited without a validation of {searcher.metric!r} at {time_metric} {length} or later"
    return None
