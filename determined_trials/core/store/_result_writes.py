"""The store's writes of what trials produce: metrics reports and checkpoint records (pending, completed, deleted)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from determined_trials.core.store._connection import StoreConnection
from determined_trials.core.store._records import dumps, now
from determined_trials.core.store._states import CheckpointState

__all__ = ["ResultWrites"]


class ResultWrites(StoreConnection):
    """Write methods of :class:`LocalStore` for metrics and checkpoints."""

    CHECKPOINT_STATES: tuple[str, ...] = tuple(CheckpointState)

    # -- metrics ----------------------------------------------------------------------------------
    def add_metrics(
        self,
        *,
        trial_id: int,
        group: str,
        steps_completed: int,
        metrics: dict[str, Any],
        batch_metrics: list[dict[str, Any]] | None = None,
    ) -> None:
        """Append one metrics report for the trial (NaN and infinities are kept)."""
        report = {"group": group, "steps_completed": steps_completed, "metrics": metrics,
                  "batch_metrics": batch_metrics, "reported_time": now()}
        self.add_metrics_reports(trial_id=trial_id, reports=[report])

    def add_metrics_reports(self, *, trial_id: int, reports: Sequence[dict[str, Any]]) -> None:
        """Append several reports of the trial in one transaction; each is ``add_metrics``' keyword
        arguments (``group``, ``steps_completed``, ``metrics``, optional ``batch_metrics``) plus
        ``reported_time``, the time it was reported."""
        rows = [_metrics_row(trial_id, report) for report in reports]
        with self._transaction() as conn:
            try:
                conn.executemany(
                    "INSERT INTO metrics (trial_id, grp, steps_completed, metrics, batch_metrics, reported_time) "
                    "VALUES (?, ?, ?, ?, ?, ?)", rows)
            except sqlite3.IntegrityError as exc:
                if "FOREIGN KEY" in str(exc):
                    raise self._not_found("trial", trial_id) from None
                raise

    def supersede_metrics_after(self, trial_id: int, steps_completed: int | None) -> int:
        """Mark the trial's current metrics reports after ``steps_completed`` superseded: the trial resumes
        from its checkpoint at that step, so what a lost attempt reported later is reported again. ``None``
        (the trial starts over, without a checkpoint) marks every report. The rows stay, for audit
        (``metrics(..., include_superseded=True)``); returns how many were marked."""
        after = -1 if steps_completed is None else _steps(steps_completed)
        with self._transaction() as conn:
            marked = conn.execute(
                "UPDATE metrics SET superseded_time = ? WHERE trial_id = ? AND steps_completed > ? "
                "AND superseded_time IS NULL", (now(), int(trial_id), after)).rowcount
            if not marked and conn.execute("SELECT 1 FROM trials WHERE id = ?", (int(trial_id),)).fetchone() is None:
                raise self._not_found("trial", trial_id)
        return int(marked)

    # -- checkpoints ------------------------------------------------------------------------------
    def add_checkpoint(
        self,
        *,
        uuid: str,
        trial_id: int | None,
        steps_completed: int,
        metadata: dict[str, Any],
        resources: dict[str, int],
        storage: str,
        pending: bool = False,
    ) -> None:
        """Record a checkpoint: ``pending`` before it is published (invisible to reads), else completed.

        Completing a pending uuid turns its row COMPLETED; any other uuid already recorded is a ``ValueError``.
        """
        sizes = {str(k): int(v) for k, v in resources.items()}
        params = (None if trial_id is None else int(trial_id), _steps(steps_completed),
                  dumps(metadata, "checkpoint metadata"), dumps(sizes, "checkpoint resources"), str(storage), now())
        state = CheckpointState.PENDING if pending else CheckpointState.COMPLETED
        with self._transaction() as conn:
            done = conn.execute(
                "UPDATE checkpoints SET trial_id = ?, steps_completed = ?, metadata = ?, resources = ?, storage = ?, "
                "report_time = ?, state = ? WHERE uuid = ? AND state = ?",
                (*params, state, str(uuid), CheckpointState.PENDING),
            ).rowcount
            if done:
                return
            try:
                conn.execute(
                    "INSERT INTO checkpoints (trial_id, steps_completed, metadata, resources, storage, report_time, "
                    "state, uuid) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (*params, state, str(uuid)),
                )
            except sqlite3.IntegrityError as exc:
                if "FOREIGN KEY" in str(exc):
                    raise self._not_found("trial", trial_id) from None
                if "UNIQUE" not in str(exc):
                    raise
                raise ValueError(f"checkpoint {uuid} is already recorded in {self.db_path}") from None

    def pending_checkpoints(self, trial_id: int) -> list[str]:
        """uuids of the trial's checkpoints recorded as pending (a writer died before or while publishing)."""
        rows = self._read("SELECT uuid FROM checkpoints WHERE trial_id = ? AND state = ? ORDER BY rowid",
                          (int(trial_id), CheckpointState.PENDING))
        return [str(r["uuid"]) for r in rows]

    def drop_pending_checkpoint(self, uuid: str) -> None:
        """Forget a pending checkpoint that was never published (no-op for any other state)."""
        with self._locked() as conn:
            conn.execute("DELETE FROM checkpoints WHERE uuid = ? AND state = ?", (str(uuid), CheckpointState.PENDING))

    def mark_checkpoint_deleted(self, uuid: str) -> None:
        """Mark a checkpoint DELETED (its files are gone); deleting twice is harmless."""
        self._update(
            "checkpoint", uuid,
            "UPDATE checkpoints SET state = ?, delete_time = COALESCE(delete_time, ?) WHERE uuid = ?",
            (CheckpointState.DELETED, now(), str(uuid)),
        )


def _metrics_row(trial_id: int, report: dict[str, Any]) -> tuple[Any, ...]:
    """One ``metrics`` row from a report (see ``LocalStore.add_metrics_reports``), its values checked."""
    group, metrics, batches = report["group"], report["metrics"], report.get("batch_metrics")
    if not isinstance(group, str) or not group:
        raise ValueError(f"a metrics group must be a non-empty string, got {group!r}")
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict, got {type(metrics).__name__}")
    batch = None if batches is None else dumps(list(batches), f"{group} batch metrics")
    return (int(trial_id), group, _steps(report["steps_completed"]), dumps(metrics, f"{group} metrics"), batch,
            float(report["reported_time"]))


def _steps(steps_completed: int) -> int:
    """A validated step count (a non-negative integer)."""
    try:
        value = int(steps_completed)
        ok = not isinstance(steps_completed, bool) and value == steps_completed and value >= 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"steps_completed must be a non-negative integer, got {steps_completed!r}")
    return value
