"""The local store's read-side records (frozen dataclasses) and the JSON/time helpers that build them."""

from __future__ import annotations

import datetime as _dt
import json
import math
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CheckpointRecord",
    "Experiment",
    "MetricRecord",
    "NotFoundError",
    "SearcherOpRecord",
    "Trial",
]

_UTC = _dt.timezone(_dt.timedelta(0))


class NotFoundError(KeyError):
    """An experiment, trial or checkpoint id that the store does not hold."""

    def __str__(self) -> str:
        # KeyError quotes its argument; show the message as written.
        return str(self.args[0]) if self.args else "not found"


@dataclass(frozen=True)
class Experiment:
    """One experiment row: its config and lifecycle. Times are timezone-aware UTC datetimes."""

    id: int
    name: str
    description: str
    labels: tuple[str, ...]
    config: dict[str, Any]
    model_dir: str | None
    state: str
    reason: str | None
    searcher_state: dict[str, Any] | None
    start_time: _dt.datetime
    end_time: _dt.datetime | None


@dataclass(frozen=True)
class Trial:
    """One trial row: hyperparameters, seed, lifecycle and the latest status/progress."""

    id: int
    experiment_id: int
    hparams: dict[str, Any]
    seed: int
    state: str
    reason: str | None
    status: str | None
    metadata: dict[str, Any]
    progress: float | None
    early_exit_reason: str | None
    restarts: int
    start_time: _dt.datetime
    end_time: _dt.datetime | None


@dataclass(frozen=True)
class MetricRecord:
    """One metrics report: a group ("training", "validation", ...) at a step count. ``superseded_time`` is
    set on a report of a lost attempt that a restart from an earlier checkpoint replaced (None: current)."""

    id: int
    trial_id: int
    group: str
    steps_completed: int
    metrics: dict[str, Any]
    batch_metrics: list[dict[str, Any]] | None
    reported_time: _dt.datetime
    superseded_time: _dt.datetime | None = None


@dataclass(frozen=True)
class CheckpointRecord:
    """One checkpoint: where it lives, what it holds (``resources`` is {relative path: bytes})."""

    uuid: str
    trial_id: int | None
    experiment_id: int | None
    steps_completed: int
    metadata: dict[str, Any]
    resources: dict[str, int]
    storage: str
    state: str
    report_time: _dt.datetime
    delete_time: _dt.datetime | None

    @property
    def size(self) -> int:
        """Total size of the checkpoint's files in bytes."""
        return sum(self.resources.values())


@dataclass(frozen=True)
class SearcherOpRecord:
    """One searcher operation report: progress towards ``length`` or its completion with ``metric``."""

    id: int
    trial_id: int
    length: int
    metric: float | None
    completed: bool
    reported_time: _dt.datetime


def _json_default(value: Any) -> Any:
    """Turn numpy-style scalars (anything 0-d with ``.item()``) into plain JSON values."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def dumps(value: Any, what: str) -> str:
    """JSON text for a column (NaN and infinities allowed); ``what`` names the value in errors."""
    try:
        return json.dumps(value, default=_json_default, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot store {what}: {exc}; pass plain numbers, strings, lists and dicts") from exc


def loads(text: str | None) -> Any:
    """Parse a JSON column (``None`` stays ``None``)."""
    return None if text is None else json.loads(text)


def now() -> float:
    """The current time as a Unix timestamp (what the store's time columns hold)."""
    return time.time()


def to_datetime(ts: float | None) -> _dt.datetime | None:
    """A stored timestamp as an aware UTC datetime."""
    return None if ts is None else _dt.datetime.fromtimestamp(ts, _UTC)


def _must_time(ts: float) -> _dt.datetime:
    result = to_datetime(ts)
    assert result is not None
    return result


def experiment_from_row(row: sqlite3.Row) -> Experiment:
    """Build an :class:`Experiment` from an ``experiments`` row."""
    return Experiment(
        id=row["id"],
        name=row["name"],
        description=row["description"],
        labels=tuple(loads(row["labels"]) or ()),
        config=loads(row["config"]),
        model_dir=row["model_dir"],
        state=row["state"],
        reason=row["reason"],
        searcher_state=loads(row["searcher_state"]),
        start_time=_must_time(row["start_time"]),
        end_time=to_datetime(row["end_time"]),
    )


def trial_from_row(row: sqlite3.Row) -> Trial:
    """Build a :class:`Trial` from a ``trials`` row."""
    return Trial(
        id=row["id"],
        experiment_id=row["experiment_id"],
        hparams=loads(row["hparams"]),
        seed=row["seed"],
        state=row["state"],
        reason=row["reason"],
        status=row["status"],
        metadata=loads(row["metadata"]),
        progress=row["progress"],
        early_exit_reason=row["early_exit_reason"],
        restarts=row["restarts"],
        start_time=_must_time(row["start_time"]),
        end_time=to_datetime(row["end_time"]),
    )


def metric_from_row(row: sqlite3.Row) -> MetricRecord:
    """Build a :class:`MetricRecord` from a ``metrics`` row."""
    return MetricRecord(
        id=row["id"],
        trial_id=row["trial_id"],
        group=row["grp"],
        steps_completed=row["steps_completed"],
        metrics=loads(row["metrics"]),
        batch_metrics=loads(row["batch_metrics"]),
        reported_time=_must_time(row["reported_time"]),
        superseded_time=to_datetime(row["superseded_time"]),
    )


def checkpoint_from_row(row: sqlite3.Row) -> CheckpointRecord:
    """Build a :class:`CheckpointRecord` from a ``checkpoints`` row joined with its trial."""
    return CheckpointRecord(
        uuid=row["uuid"],
        trial_id=row["trial_id"],
        experiment_id=row["experiment_id"],
        steps_completed=row["steps_completed"],
        metadata=loads(row["metadata"]),
        resources=loads(row["resources"]),
        storage=row["storage"],
        state=row["state"],
        report_time=_must_time(row["report_time"]),
        delete_time=to_datetime(row["delete_time"]),
    )


def searcher_op_from_row(row: sqlite3.Row) -> SearcherOpRecord:
    """Build a :class:`SearcherOpRecord` from a ``searcher_ops`` row."""
    return SearcherOpRecord(
        id=row["id"],
        trial_id=row["trial_id"],
        length=row["length"],
        metric=row["metric"],
        completed=bool(row["completed"]),
        reported_time=_must_time(row["reported_time"]),
    )


def numeric(value: Any) -> float | None:
    """``value`` as a float usable for comparison, or ``None`` (missing, non-numeric, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    result = float(value)
    return None if math.isnan(result) else result
