"""The store's record of each trial's run in an experiment tracker (MLflow, W&B): the run id every attempt of
the trial resumes into, its link, how far the trial's metric rows have been forwarded (and what of them the run
holds), the checkpoints it has recorded, and the rows the forwarder reads."""

from __future__ import annotations

import json
from typing import Any

from determined_trials.core.store import _records as _rec
from determined_trials.core.store._connection import StoreConnection
from determined_trials.core.store._records import MetricRecord

__all__ = ["TrackerRuns"]


class TrackerRuns(StoreConnection):
    """Tracker runs of trials (one per trial and tracker) and the metric rows ready to forward to them."""

    def tracker_run(self, trial_id: int, tracker: str) -> dict[str, Any] | None:
        """``{"run_id", "url", "forwarded_id", "checkpoints", "progress"}`` of the trial's run in ``tracker``
        (``checkpoints``: the uuids it has recorded; ``progress``: the forwarder's record of what the run holds,
        see ``trackers``), or ``None`` before one exists."""
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

    def set_tracker_forwarded(self, trial_id: int, tracker: str, metric_id: int,
                              progress: dict[str, Any] | None = None) -> None:
        """The forwarder has dealt with every metric row of the trial up to ``metric_id`` for ``tracker``'s run
        (sent it, or left it: see ``progress``, kept with it when given)."""
        self._update(
            "tracker run", (trial_id, tracker),
            "UPDATE tracker_runs SET forwarded_id = MAX(forwarded_id, ?), progress = COALESCE(?, progress) "
            "WHERE trial_id = ? AND tracker = ?",
            (int(metric_id), None if progress is None else json.dumps(progress), int(trial_id), str(tracker)),
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

    def metrics_after(self, trial_id: int, after_id: int, *, limit: int = 1000) -> list[MetricRecord]:
        """The trial's metric rows after row ``after_id``, in report (id) order, superseded ones included (their
        ``superseded_time`` says so): what a tracker's forwarder looks at next."""
        rows = self._read("SELECT * FROM metrics WHERE trial_id = ? AND id > ? ORDER BY id LIMIT ?",
                          (int(trial_id), int(after_id), int(limit)))
        return [_rec.metric_from_row(r) for r in rows]

    def metrics_at(self, trial_id: int, group: str, steps_completed: int, before_id: int) -> list[MetricRecord]:
        """The trial's rows of ``group`` at ``steps_completed`` reported before row ``before_id`` (superseded ones
        included), in report order: what earlier attempts reported at a step a restart reports again."""
        rows = self._read("SELECT * FROM metrics WHERE trial_id = ? AND steps_completed = ? AND grp = ? AND id < ? "
                          "ORDER BY id", (int(trial_id), int(steps_completed), str(group), int(before_id)))
        return [_rec.metric_from_row(r) for r in rows]


_COLUMNS = "run_id, url, forwarded_id, checkpoints_forwarded, progress"


def _run_from_row(row: Any) -> dict[str, Any]:
    return {"run_id": row["run_id"], "url": row["url"], "forwarded_id": int(row["forwarded_id"]),
            "checkpoints": list(json.loads(row["checkpoints_forwarded"])),
            "progress": dict(json.loads(row["progress"]))}
