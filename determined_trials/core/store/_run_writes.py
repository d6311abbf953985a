"""The store's writes of experiments and trials: creation, states, owners, status lines, restarts, searcher ops."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from determined_trials.core.store._connection import StoreConnection
from determined_trials.core.store._records import dumps, now
from determined_trials.core.store._states import RunState

__all__ = ["RunWrites"]

_OWNERS_TABLE = ("CREATE TABLE IF NOT EXISTS owners (experiment_id INTEGER PRIMARY KEY REFERENCES experiments(id), "
                 "pid INTEGER NOT NULL, started REAL NOT NULL)")


class RunWrites(StoreConnection):
    """Write methods of :class:`LocalStore` for experiments, their trials and the trials' searcher operations."""

    EXPERIMENT_STATES: tuple[str, ...] = tuple(RunState)
    TRIAL_STATES: tuple[str, ...] = tuple(RunState)

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
            for table in ("metrics", "searcher_ops", "checkpoints", "tracker_runs", "trial_time"):
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
    def create_trial(
        self, *, experiment_id: int, hparams: dict[str, Any], seed: int, parent_trial_id: int | None = None,
        parent_checkpoint: str | None = None, search_round: int | None = None,
    ) -> int:
        """Record a new ACTIVE trial of the experiment and return its id; a PBT child also records its
        lineage (the parent trial, the checkpoint it starts from, the round it starts in)."""
        return self._insert(
            ("experiment", experiment_id),
            "INSERT INTO trials (experiment_id, hparams, seed, start_time, parent_trial_id, parent_checkpoint, "
            "search_round) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (int(experiment_id), dumps(hparams, "hparams"), int(seed), now(), parent_trial_id, parent_checkpoint,
             search_round),
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


def _checked_state(state: str, allowed: tuple[str, ...], kind: str) -> str:
    """``state`` (an enum's value or name also works) upper-cased, if it is one of ``allowed``."""
    text = str(getattr(state, "value", state)).upper()
    if text not in allowed:
        raise ValueError(f"unknown {kind} state {state!r}; use one of {', '.join(allowed)}")
    return text
