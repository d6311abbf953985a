"""``LocalStore``: the SQLite database in a run dir that plays the cluster master's part.

It records experiments, trials, metrics, checkpoints and searcher progress; several processes may
write at once (WAL journal, busy timeout, short transactions, one connection per process).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from determined_trials.core.store import _schema
from determined_trials.core.store._reads import StoreReads
from determined_trials.core.store._records import (
    CheckpointRecord,
    Experiment,
    MetricRecord,
    NotFoundError,
    SearcherOpRecord,
    Trial,
    dumps,
    now,
)
from determined_trials.core.store._states import CheckpointState, RunState

__all__ = [
    "CheckpointRecord",
    "Experiment",
    "LocalStore",
    "MetricRecord",
    "NotFoundError",
    "SearcherOpRecord",
    "Trial",
]

STORE_FILENAME = "store.sqlite"
_OWNERS_TABLE = ("CREATE TABLE IF NOT EXISTS owners (experiment_id INTEGER PRIMARY KEY REFERENCES experiments(id), "
                 "pid INTEGER NOT NULL, started REAL NOT NULL)")


class LocalStore(StoreReads):
    """The run dir's database: write methods for the Core API, read methods for users and the CLI.

    Safe to share across threads and across ``fork``: each process opens its own connection on
    first use. Missing ids raise :class:`NotFoundError`, a ``KeyError`` naming the id and the file.
    """

    EXPERIMENT_STATES: tuple[str, ...] = tuple(RunState)
    TRIAL_STATES: tuple[str, ...] = tuple(RunState)
    CHECKPOINT_STATES: tuple[str, ...] = tuple(CheckpointState)

    def __init__(self, run_dir: str | os.PathLike[str], *, create: bool = True) -> None:
        """Open the store in ``run_dir``; with ``create`` (default) make the folder and schema if missing."""
        self.path = Path(run_dir).expanduser().absolute()
        self.db_path = self.path / STORE_FILENAME
        if create:
            self.path.mkdir(parents=True, exist_ok=True)
        elif not self.db_path.is_file():
            where = "has no store" if self.path.is_dir() else "does not exist"
            raise FileNotFoundError(
                f"run dir {self.path} {where} ({STORE_FILENAME} missing); pass the run dir an "
                "experiment wrote to (--run-dir or DET_RUN_DIR)"
            )
        self._pid = -1
        self._conn_: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        with self._locked() as conn:
            try:
                _schema.ensure_schema(conn, self.db_path)
            except sqlite3.DatabaseError as exc:
                raise RuntimeError(f"{self.db_path} is not a usable store: {exc}") from exc

    def __repr__(self) -> str:
        return f"LocalStore({str(self.path)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the run dir only (e.g. to hand the store to a spawned process)."""
        return (LocalStore, (str(self.path),))

    # -- connection -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        """This process's connection, held exclusively by the calling thread."""
        pid = os.getpid()
        if pid != self._pid:
            # A forked child must not touch the parent's connection or lock: start afresh.
            self._lock = threading.RLock()
            self._conn_ = None
            self._pid = pid
        with self._lock:
            if self._conn_ is None:
                try:
                    self._conn_ = _schema.connect(self.db_path)
                except sqlite3.DatabaseError as exc:
                    raise RuntimeError(f"{self.db_path} is not a usable store: {exc}") from exc
            yield self._conn_

    def close(self) -> None:
        """Close this process's connection (the store reopens it on the next call)."""
        with self._lock:
            if self._conn_ is not None and self._pid == os.getpid():
                self._conn_.close()
            self._conn_ = None

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._locked() as conn:
            return conn.execute(sql, tuple(params)).fetchall()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A short write transaction; BEGIN IMMEDIATE takes the write lock up front (waits if busy)."""
        with self._locked() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _update(self, kind: str, key: object, sql: str, params: Sequence[Any]) -> None:
        """Run one UPDATE that must touch exactly the row ``key`` of ``kind``."""
        with self._locked() as conn:
            if conn.execute(sql, tuple(params)).rowcount == 0:
                raise self._not_found(kind, key)

    def _insert(self, parent: tuple[str, object], sql: str, params: Sequence[Any]) -> int:
        """Run one INSERT; a missing parent row (foreign key) becomes :class:`NotFoundError`."""
        with self._locked() as conn:
            try:
                cursor = conn.execute(sql, tuple(params))
            except sqlite3.IntegrityError as exc:
                if "FOREIGN KEY" in str(exc):
                    raise self._not_found(*parent) from None
                raise
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    # -- experiments ------------------------------------------------------------------------------
    def create_experiment(
        self,
        *,
        name: str,
        config: dict[str, Any],
        description: str = "",
        labels: Sequence[str] = (),
        model_dir: str | None = None,
    ) -> int:
        """Record a new ACTIVE experiment and return its id."""
        with self._locked() as conn:
            cursor = conn.execute(
                "INSERT INTO experiments (name, description, labels, config, model_dir, start_time) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (str(name), description, dumps(list(labels), "labels"), dumps(config, "the config"),
                 None if model_dir is None else str(model_dir), now()),
            )
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    def set_experiment_state(self, experiment_id: int, state: str, reason: str | None = None) -> None:
        """Move the experiment to ``state``; terminal states stamp the end time, ACTIVE clears it."""
        state = _checked_state(state, self.EXPERIMENT_STATES, "experiment")
        end = now() if state in RunState.TERMINAL else None
        self._update(
            "experiment", experiment_id,
            "UPDATE experiments SET state = ?, reason = ?, end_time = ? WHERE id = ?",
            (state, reason, end, int(experiment_id)),
        )

    def set_searcher_state(self, experiment_id: int, state: dict[str, Any]) -> None:
        """Save the searcher's resumable state (a JSON-able dict)."""
        self._update(
            "experiment", experiment_id,
            "UPDATE experiments SET searcher_state = ? WHERE id = ?",
            (dumps(state, "the searcher state"), int(experiment_id)),
        )

    def set_experiment_model_dir(self, experiment_id: int, model_dir: str) -> None:
        """Record where the experiment's snapshot of its context directory lives."""
        self._update(
            "experiment", experiment_id,
            "UPDATE experiments SET model_dir = ? WHERE id = ?", (str(model_dir), int(experiment_id)),
        )

    def delete_experiment(self, experiment_id: int) -> None:
        """Remove the experiment and everything recorded for it (trials, metrics, checkpoint rows);
        checkpoint files are the caller's to delete first."""
        key = int(experiment_id)
        self.experiment(key)
        trials = "SELECT id FROM trials WHERE experiment_id = ?"
        with self._transaction() as conn:
            for table in ("metrics", "searcher_ops", "checkpoints"):
                conn.execute(f"DELETE FROM {table} WHERE trial_id IN ({trials})", (key,))
            conn.execute("DELETE FROM trials WHERE experiment_id = ?", (key,))
            conn.execute(_OWNERS_TABLE)
            conn.execute("DELETE FROM owners WHERE experiment_id = ?", (key,))
            conn.execute("DELETE FROM experiments WHERE id = ?", (key,))

    def set_experiment_owner(self, experiment_id: int, pid: int, started: float) -> None:
        """Record the process (pid and start time) that runs the experiment now."""
        self.experiment(experiment_id)
        with self._transaction() as conn:
            conn.execute(_OWNERS_TABLE)  # created on first use: older run folders lack it
            conn.execute("INSERT OR REPLACE INTO owners (experiment_id, pid, started) VALUES (?, ?, ?)",
                         (int(experiment_id), int(pid), float(started)))

    def experiment_owner(self, experiment_id: int) -> tuple[int, float] | None:
        """(pid, start time) of the process that last ran the experiment, if recorded."""
        try:
            rows = self._read("SELECT pid, started FROM owners WHERE experiment_id = ?", (int(experiment_id),))
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise
        return (int(rows[0][0]), float(rows[0][1])) if rows else None

    # -- trials -----------------------------------------------------------------------------------
    def create_trial(self, *, experiment_id: int, hparams: dict[str, Any], seed: int) -> int:
        """Record a new ACTIVE trial of the experiment and return its id."""
        return self._insert(
            ("experiment", experiment_id),
            "INSERT INTO trials (experiment_id, hparams, seed, start_time) VALUES (?, ?, ?, ?)",
            (int(experiment_id), dumps(hparams, "hparams"), int(seed), now()),
        )

    def set_trial_state(self, trial_id: int, state: str, reason: str | None = None) -> None:
        """Move the trial to ``state``; terminal states stamp the end time, ACTIVE clears it. The status
        line follows: a trial that leaves ACTIVE shows its state (``completed``, ``paused``, ...), one
        that (re)starts shows none until it sets one."""
        state = _checked_state(state, self.TRIAL_STATES, "trial")
        end = now() if state in RunState.TERMINAL else None
        status = None if state == RunState.ACTIVE else state.lower()
        self._update(
            "trial", trial_id,
            "UPDATE trials SET state = ?, reason = ?, end_time = ?, status = ? WHERE id = ?",
            (state, reason, end, status, int(trial_id)),
        )

    def set_trial_status(self, trial_id: int, status: str) -> None:
        """Set the trial's free-text status line (``TrainContext.set_status``) while it is ACTIVE; a late
        write after its end (a held status stored at close) leaves the end's status alone."""
        with self._locked() as conn:
            sql = "UPDATE trials SET status = ? WHERE id = ? AND state = ?"
            if conn.execute(sql, (str(status), int(trial_id), RunState.ACTIVE)).rowcount == 0 and not conn.execute(
                    "SELECT 1 FROM trials WHERE id = ?", (int(trial_id),)).fetchone():
                raise self._not_found("trial", trial_id)

    def set_trial_metadata(self, trial_id: int, metadata: dict[str, Any]) -> None:
        """Replace the trial's metadata dict (``TrainContext.set_metadata``)."""
        if not isinstance(metadata, dict):
            raise TypeError(f"trial metadata must be a dict, got {type(metadata).__name__}")
        self._update(
            "trial", trial_id,
            "UPDATE trials SET metadata = ? WHERE id = ?", (dumps(metadata, "trial metadata"), int(trial_id)),
        )

    def set_trial_progress(self, trial_id: int, progress: float) -> None:
        """Record the fraction of the trial's searcher work done, a number in [0, 1]."""
        value = float(progress)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"trial progress must be between 0 and 1, got {progress!r}")
        self._update(
            "trial", trial_id, "UPDATE trials SET progress = ? WHERE id = ?", (value, int(trial_id))
        )

    def set_trial_early_exit(self, trial_id: int, reason: str) -> None:
        """Record that the trial exited early and why (e.g. ``INVALID_HP``, ``USER_REQUESTED_STOP``)."""
        text = str(getattr(reason, "value", reason))
        self._update(
            "trial", trial_id, "UPDATE trials SET early_exit_reason = ? WHERE id = ?", (text, int(trial_id))
        )

    def increment_trial_restarts(self, trial_id: int) -> int:
        """Count one more restart of the trial (after an error) and return the new count."""
        with self._transaction() as conn:
            conn.execute("UPDATE trials SET restarts = restarts + 1 WHERE id = ?", (int(trial_id),))
            row = conn.execute("SELECT restarts FROM trials WHERE id = ?", (int(trial_id),)).fetchone()
        if row is None:
            raise self._not_found("trial", trial_id)
        return int(row[0])

    def record_searcher_op(self, trial_id: int, length: int, metric: float | None, completed: bool) -> None:
        """Record progress on (``completed=False``) or completion of a searcher operation."""
        self._insert(
            ("trial", trial_id),
            "INSERT INTO searcher_ops (trial_id, length, metric, completed, reported_time) "
            "VALUES (?, ?, ?, ?, ?)",
            (int(trial_id), int(length), None if metric is None else float(metric), int(bool(completed)),
             now()),
        )

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


def _checked_state(state: str, allowed: tuple[str, ...], kind: str) -> str:
    """``state`` (an enum's value or name also works) upper-cased, if it is one of ``allowed``."""
    text = str(getattr(state, "value", state)).upper()
    if text not in allowed:
        raise ValueError(f"unknown {kind} state {state!r}; use one of {', '.join(allowed)}")
    return text


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
