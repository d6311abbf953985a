"""The store's record of each trial's run in an experiment tracker (MLflow, W&B): the run id every attempt of
the trial resumes into, its link, how far the trial's metric rows have been forwarded, the checkpoints it has
recorded, and which rows are final."""

from __future__ import annotations

import json
from typing import Any

from determined_trials.core.store import _records as _rec
from determined_trials.core.store._connection import StoreConnection
from determined_trials.core.store._records import MetricRecord
from determined_trials.core.store._states import CheckpointState

__all__ = ["TrackerRuns"]


class TrackerRuns(StoreConnection):
    """Tracker runs of trials (one per trial and tracker) and the metric rows ready to forward to them."""

    def tracker_run(self, trial_id: int, tracker: str) -> dict[str, Any] | None:
        """``{"run_id", "url", "forwarded_id", "checkpoints"}`` of the trial's run in ``tracker`` (``checkpoints``:
        the uuids it has recorded), or ``None`` before one exists."""
        rows = self._read(f"SELECT {_COLUMNS} FROM tracker_runs WHERE trial_id = ? AND tracker = ?",
                          (int(trial_id), str(tracker)))
        return _run_from_row(rows[0]) if rows else None

    def tracker_runs(self, trial_id: int) -> dict[str, dict[str, Any]]:
        """Every tracker's run of the trial: tracker name -> the dict ``tracker_run`` returns."""
        rows = self._read(f"SELECT tracker, {_COLUMNS} FROM tracker_runs WHERE trial_id = ? ORDER BY tracker",
                          (int(trial_id),))
        return {r["tracker"]: _run_from_row(r) for r in rows}

    def set_tracker_run(self, trial_id: int, tracker: str, run_id: str, url: str | None = None) -> None:
        """Record the trial's run in ``tracker`` (its forwarding watermark is kept when the run is known)."""
        self._insert(
            ("trial", trial_id),
            "INSERT INTO tracker_runs (trial_id, tracker, run_id, url) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (trial_id, tracker) DO UPDATE SET run_id = excluded.run_id, url = excluded.url",
            (int(trial_id), str(tracker), str(run_id), url),
        )

    def set_tracker_forwarded(self, trial_id: int, tracker: str, metric_id: int) -> None:
        """Every final metric row of the trial up to ``metric_id`` has reached ``tracker``'s run."""
        self._update(
            "tracker run", (trial_id, tracker),
            "UPDATE tracker_runs SET forwarded_id = MAX(forwarded_id, ?) WHERE trial_id = ? AND tracker = ?",
            (int(metric_id), int(trial_id), str(tracker)),
        )

    def add_tracker_checkpoint(self, trial_id: int, tracker: str, uuid: str) -> None:
        """``tracker``'s run has recorded checkpoint ``uuid`` (a later process of the trial does not record it
        again). Only the chief rank's forwarder writes this, so reading then writing the list is safe."""
        known = self.tracker_run(trial_id, tracker)
        if known is None or uuid in known["checkpoints"]:
            return
        self._update(
            "tracker run", (trial_id, tracker),
            "UPDATE tracker_runs SET checkpoints_forwarded = ? WHERE trial_id = ? AND tracker = ?",
            (json.dumps([*known["checkpoints"], str(uuid)]), int(trial_id), str(tracker)),
        )

    def final_metrics(self, trial_id: int, after_id: int, *, ended: bool, limit: int = 1000) -> list[MetricRecord]:
        """The trial's metric rows after row ``after_id`` that no restart can take back, in report order: those
        a completed checkpoint covers (steps at most its steps) or, once the trial has ``ended``, all of them;
        never a superseded one (a restart from an earlier checkpoint took it back)."""
        covered = "" if ended else (
            " AND steps_completed <= (SELECT COALESCE(MAX(steps_completed), -1) FROM checkpoints "
            "WHERE trial_id = ? AND state = ?)")
        params: tuple[Any, ...] = (int(trial_id), int(after_id))
        if not ended:
            params += (int(trial_id), CheckpointState.COMPLETED)
        rows = self._read(f"SELECT * FROM metrics WHERE trial_id = ? AND id > ? AND superseded_time IS NULL{covered} "
                          "ORDER BY id LIMIT ?",
                          (*params, int(limit)))
        return [_rec.metric_from_row(r) for r in rows]


_COLUMNS = "run_id, url, forwarded_id, checkpoints_forwarded"


def _run_from_row(row: Any) -> dict[str, Any]:
    return {"run_id": row["run_id"], "url": row["url"], "forwarded_id": int(row["forwarded_id"]),
            "checkpoints": list(json.loads(row["checkpoints_forwarded"]))}
