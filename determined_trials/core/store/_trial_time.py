"""Where each trial's wall time went (goodput): the parts its runner and its processes add as they go, the
batches it reached (what a restart trains again), its runner's open attempt, and the breakdown read back."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from determined_trials.core.store._connection import StoreConnection
from determined_trials.core.store._states import RunState

__all__ = ["SPAWNED_AT_ENV", "TIME_PARTS", "TrialTimes", "summed_time", "time_breakdown"]

SPAWNED_AT_ENV = "DET_TRIAL_SPAWNED_AT"
"""When the runner started the trial's process (epoch seconds): where its ``start`` part begins."""

TIME_PARTS: tuple[str, ...] = (
    "queued", "start", "build", "train", "data_wait", "validation", "checkpoint", "restore", "replay")
"""The measured parts of a trial's wall time, in seconds; ``other`` is the rest of ``wall``."""
_REACHED = "_reached"  # the most batches any attempt trained (MAX, not a sum)
_OPEN = "_open"  # when the runner's attempt in progress began (set and cleared, not a sum)
_WALL = "wall"  # the wall time of the runner's ended attempts: queued to the process's exit
_ROW = "t.part, t.seconds, r.state FROM trial_time t JOIN trials r ON r.id = t.trial_id"


class TrialTimes(StoreConnection):
    """Each trial's time parts (table ``trial_time``: trial, part, seconds)."""

    def add_trial_time(self, trial_id: int, parts: Mapping[str, float], batches_reached: int | None = None) -> None:
        """Add ``parts`` (a part of ``TIME_PARTS`` or ``"wall"`` -> seconds) to the trial's, and raise the batches
        it reached to ``batches_reached``; one transaction."""
        rows = [(int(trial_id), _checked(part), float(seconds)) for part, seconds in parts.items() if seconds]
        with self._transaction() as conn:
            conn.executemany(
                "INSERT INTO trial_time (trial_id, part, seconds) VALUES (?, ?, ?) ON CONFLICT (trial_id, part) "
                "DO UPDATE SET seconds = seconds + excluded.seconds", rows)
            if batches_reached is not None:
                conn.execute(
                    "INSERT INTO trial_time (trial_id, part, seconds) VALUES (?, ?, ?) ON CONFLICT (trial_id, part) "
                    "DO UPDATE SET seconds = MAX(seconds, excluded.seconds)",
                    (int(trial_id), _REACHED, float(batches_reached)))

    def set_trial_attempt(self, trial_id: int, since: float) -> None:
        """The runner: its attempt of the trial began at ``since`` (epoch seconds: when it was queued); until
        ``end_trial_attempt`` the trial's wall counts up to the time it is read."""
        self._insert(("trial", trial_id),
                     "INSERT OR REPLACE INTO trial_time (trial_id, part, seconds) VALUES (?, ?, ?)",
                     (int(trial_id), _OPEN, float(since)))

    def end_trial_attempt(self, trial_id: int, ended: float | None = None) -> None:
        """The runner: its attempt of the trial ended at ``ended`` (default: now): the time since ``set_trial_attempt``
        is added to the trial's wall, and no attempt is open."""
        ended = time.time() if ended is None else ended
        with self._transaction() as conn:
            row = conn.execute("SELECT seconds FROM trial_time WHERE trial_id = ? AND part = ?",
                               (int(trial_id), _OPEN)).fetchone()
            if row is None:
                return
            conn.execute("DELETE FROM trial_time WHERE trial_id = ? AND part = ?", (int(trial_id), _OPEN))
            conn.execute(
                "INSERT INTO trial_time (trial_id, part, seconds) VALUES (?, ?, ?) ON CONFLICT (trial_id, part) "
                "DO UPDATE SET seconds = seconds + excluded.seconds", (int(trial_id), _WALL, max(0.0, ended - row[0])))

    def batches_reached(self, trial_id: int) -> int:
        """The most batches any attempt of the trial trained (0 before any reported)."""
        rows = self._read("SELECT seconds FROM trial_time WHERE trial_id = ? AND part = ?", (int(trial_id), _REACHED))
        return int(rows[0]["seconds"]) if rows else 0

    def trial_time(self, trial_id: int, *, now: float) -> dict[str, float]:
        """The trial's breakdown (``time_breakdown``) at ``now``."""
        rows = self._read(f"SELECT {_ROW} WHERE t.trial_id = ?", (int(trial_id),))
        return time_breakdown({r["part"]: r["seconds"] for r in rows if _counts(r)}, now=now)

    def experiment_time(self, experiment_id: int, *, now: float) -> dict[str, float]:
        """The breakdowns of the experiment's trials summed (``summed_time``: with ``goodput``)."""
        rows = self._read(f"SELECT t.trial_id, {_ROW} WHERE r.experiment_id = ?", (int(experiment_id),))
        raw: dict[int, dict[str, float]] = {}
        for r in rows:
            if _counts(r):
                raw.setdefault(r["trial_id"], {})[r["part"]] = r["seconds"]
        return summed_time(time_breakdown(parts, now=now) for parts in raw.values())


def time_breakdown(raw: Mapping[str, float], *, now: float) -> dict[str, float]:
    """Every part of ``TIME_PARTS``, ``other`` and ``wall`` from the stored rows. ``wall`` is the runner's (its
    ended attempts, and the one in progress up to ``now``); a trial no runner ran (a plain script) has none, and
    its wall is the sum of its parts. ``other`` is the wall the parts do not cover (never below 0)."""
    parts = {part: float(raw.get(part, 0.0)) for part in TIME_PARTS}
    measured = sum(parts.values())
    wall = float(raw.get(_WALL, 0.0)) + (max(0.0, now - raw[_OPEN]) if _OPEN in raw else 0.0)
    if _WALL not in raw and _OPEN not in raw:
        wall = measured
    wall = max(wall, measured)
    return {**parts, "other": wall - measured, "wall": wall}


def summed_time(breakdowns: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Trials' breakdowns added up, with ``goodput``: the fraction of the wall that was training (0 with no wall)."""
    total = dict.fromkeys((*TIME_PARTS, "other", "wall"), 0.0)
    for breakdown in breakdowns:
        for part in total:
            total[part] += breakdown.get(part, 0.0)
    return {**total, "goodput": total["train"] / total["wall"] if total["wall"] > 0 else 0.0}


def _counts(row: Any) -> bool:
    """An open attempt counts only while its trial is ACTIVE (a runner killed -9 left one behind)."""
    return bool(row["part"] != _OPEN or row["state"] == RunState.ACTIVE)


def _checked(part: str) -> str:
    if part not in TIME_PARTS and part != _WALL:
        raise ValueError(f"unknown time part {part!r}; one of {[*TIME_PARTS, _WALL]}")
    return part
