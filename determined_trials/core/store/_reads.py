"""The local store's reading API: experiments, trials, metrics, checkpoints, searcher ops, best validation."""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from determined_trials.core.store import _records as _rec
from determined_trials.core.store._records import (
    CheckpointRecord,
    Experiment,
    MetricRecord,
    NotFoundError,
    SearcherOpRecord,
    Trial,
)
from determined_trials.core.store._states import CheckpointState

__all__ = ["StoreReads"]

_CHECKPOINT_SELECT = (
    "SELECT c.*, t.experiment_id AS experiment_id FROM checkpoints AS c "
    "LEFT JOIN trials AS t ON t.id = c.trial_id"
)


_CURRENT = "superseded_time IS NULL"
"""The condition on ``metrics`` rows of a trial's one timeline (not replaced by a restart); every metrics read
applies it, only ``metrics``/``metric_groups`` with ``include_superseded`` leave it out."""

# Parameters of the statements below: ?1 the group, ?2 the experiment id, ?3 the metric's JSON path, ?4 the most
# reports read per trial.
_MINE = f"grp = ?1 AND trial_id = s.tid AND {_CURRENT}"
_SAMPLED_IDS = (
    "WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k WHERE i + 1 < ?4), "
    "s(tid, n, lo, hi) AS (SELECT s.tid, "
    "(SELECT COUNT(*) FROM (SELECT 1 FROM metrics WHERE grp = ?1 AND trial_id = s.tid LIMIT ?4 + 1)), "
    f"(SELECT MIN(id) FROM metrics WHERE {_MINE}), (SELECT MAX(id) FROM metrics WHERE {_MINE}) "
    "FROM (SELECT id AS tid FROM trials WHERE experiment_id = ?2) AS s) "
    f"SELECT (SELECT id FROM metrics WHERE {_MINE} AND id >= s.lo + (s.hi - s.lo) * k.i / (?4 - 1) "
    "ORDER BY id LIMIT 1) FROM s, k WHERE s.n > ?4 UNION SELECT m.id FROM s CROSS JOIN metrics AS m "
    f"ON m.grp = ?1 AND m.trial_id = s.tid AND m.{_CURRENT} WHERE s.n <= ?4"
)
"""Row ids of each trial's reports of the group: all of a trial's when it has at most ?4 (counted in the index
alone, reports a restart replaced included), else an even sample:
for each of ?4 evenly spaced ids from its first report to its last, the first at or after it. Index seeks
(``metrics_by_group``), never a walk over every report; the CROSS JOIN keeps the trials the outer loop."""
_ALL_IDS = (f"SELECT id FROM metrics WHERE grp = ?1 AND {_CURRENT} AND trial_id IN "
            "(SELECT id FROM trials WHERE experiment_id = ?2)")
# SQLite's JSON functions reject NaN and Infinity (which the store keeps): such rows come back raw
_POINTS = (
    "SELECT trial_id, steps_completed, id, v, raw FROM (SELECT trial_id, steps_completed, id, "
    "CASE WHEN json_valid(metrics) THEN json_extract(metrics, ?3) END AS v, "
    "CASE WHEN json_valid(metrics) THEN NULL ELSE metrics END AS raw FROM metrics WHERE id IN ({ids})) "
    "WHERE raw IS NOT NULL OR typeof(v) IN ('integer', 'real')"
)


class StoreReads:
    """Read methods shared by :class:`LocalStore`; subclasses provide ``_read`` and ``db_path``."""

    path: Path
    db_path: Path

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        raise NotImplementedError

    def _not_found(self, kind: str, key: object) -> NotFoundError:
        """The error for an id the store does not hold, saying where we looked and how to list ids."""
        return NotFoundError(
            f"{kind} {key!r} not found in the store {self.db_path} "
            f"(`det-trials --run-dir {self.path} {kind} list` shows what it holds)"
        )

    # -- experiments ------------------------------------------------------------------------------
    def experiments(self) -> list[Experiment]:
        """All experiments, oldest first."""
        return [_rec.experiment_from_row(r) for r in self._read("SELECT * FROM experiments ORDER BY id")]

    def experiment(self, experiment_id: int) -> Experiment:
        """One experiment; :class:`NotFoundError` (a ``KeyError``) if the id is unknown."""
        rows = self._read("SELECT * FROM experiments WHERE id = ?", (int(experiment_id),))
        if not rows:
            raise self._not_found("experiment", experiment_id)
        return _rec.experiment_from_row(rows[0])

    def get_searcher_state(self, experiment_id: int) -> dict[str, Any] | None:
        """The searcher state last saved with :meth:`set_searcher_state`, or ``None``."""
        return self.experiment(experiment_id).searcher_state

    # -- trials -----------------------------------------------------------------------------------
    def trials(self, experiment_id: int | None = None) -> list[Trial]:
        """All trials (of one experiment when ``experiment_id`` is given), in creation order."""
        if experiment_id is None:
            rows = self._read("SELECT * FROM trials ORDER BY id")
        else:
            self.experiment(experiment_id)
            rows = self._read(
                "SELECT * FROM trials WHERE experiment_id = ? ORDER BY id", (int(experiment_id),)
            )
        return [_rec.trial_from_row(r) for r in rows]

    def trial(self, trial_id: int) -> Trial:
        """One trial; :class:`NotFoundError` (a ``KeyError``) if the id is unknown."""
        rows = self._read("SELECT * FROM trials WHERE id = ?", (int(trial_id),))
        if not rows:
            raise self._not_found("trial", trial_id)
        return _rec.trial_from_row(rows[0])

    def get_trial_metadata(self, trial_id: int) -> dict[str, Any]:
        """The trial's metadata dict (empty until :meth:`set_trial_metadata` is called)."""
        return self.trial(trial_id).metadata

    def searcher_ops(self, trial_id: int) -> list[SearcherOpRecord]:
        """The trial's searcher-operation reports, in report order."""
        self.trial(trial_id)
        rows = self._read("SELECT * FROM searcher_ops WHERE trial_id = ? ORDER BY id", (int(trial_id),))
        return [_rec.searcher_op_from_row(r) for r in rows]

    # -- metrics ----------------------------------------------------------------------------------
    def metrics(self, trial_id: int, group: str | None = None, *,
                include_superseded: bool = False) -> list[MetricRecord]:
        """The trial's metrics (one group or all), ordered by steps, then by report order: its one timeline,
        or with ``include_superseded`` also the reports of lost attempts that a restart replaced (for audit;
        their ``superseded_time`` is set)."""
        self.trial(trial_id)
        sql = "SELECT * FROM metrics WHERE trial_id = ?" + ("" if include_superseded else f" AND {_CURRENT}")
        params: list[Any] = [int(trial_id)]
        if group is not None:
            sql += " AND grp = ?"
            params.append(group)
        rows = self._read(sql + " ORDER BY steps_completed, id", params)
        return [_rec.metric_from_row(r) for r in rows]

    def metric_groups(self, trial_id: int, *, include_superseded: bool = False) -> list[str]:
        """The metric groups the trial has reported, in order of first report (of its current reports, unless
        ``include_superseded``)."""
        self.trial(trial_id)
        current = "" if include_superseded else f" AND {_CURRENT}"
        rows = self._read(
            f"SELECT grp FROM metrics WHERE trial_id = ?{current} GROUP BY grp ORDER BY MIN(id)", (int(trial_id),)
        )
        return [r["grp"] for r in rows]

    def best_validation(self, experiment_id: int, metric: str, smaller_is_better: bool) -> float | None:
        """Best value of ``metric`` over all "validation" reports of the experiment's trials.

        Reports without the metric, or with a NaN or non-numeric value, are skipped; ``None`` if
        no report has a usable value.
        """
        self.experiment(experiment_id)
        rows = self._read(
            "SELECT m.metrics FROM metrics AS m JOIN trials AS t ON t.id = m.trial_id "
            f"WHERE t.experiment_id = ? AND m.grp = 'validation' AND m.{_CURRENT}",
            (int(experiment_id),),
        )
        values = [_rec.numeric(_rec.loads(r["metrics"]).get(metric)) for r in rows]
        usable = [v for v in values if v is not None]
        if not usable:
            return None
        return min(usable) if smaller_is_better else max(usable)

    # -- checkpoints ------------------------------------------------------------------------------
    def checkpoints(
        self,
        *,
        trial_id: int | None = None,
        experiment_id: int | None = None,
        include_deleted: bool = False,
    ) -> list[CheckpointRecord]:
        """Checkpoints in report order, optionally of one trial and/or experiment."""
        clauses: list[str] = []
        params: list[Any] = []
        if trial_id is not None:
            self.trial(trial_id)
            clauses.append("c.trial_id = ?")
            params.append(int(trial_id))
        if experiment_id is not None:
            self.experiment(experiment_id)
            clauses.append("t.experiment_id = ?")
            params.append(int(experiment_id))
        clauses.append("c.state != ?" if include_deleted else "c.state = ?")
        params.append(CheckpointState.PENDING if include_deleted else CheckpointState.COMPLETED)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._read(f"{_CHECKPOINT_SELECT}{where} ORDER BY c.rowid", params)
        return [_rec.checkpoint_from_row(r) for r in rows]

    def checkpoint(self, uuid: str) -> CheckpointRecord:
        """One checkpoint (also a deleted one); :class:`NotFoundError` if the uuid is unknown."""
        rows = self._read(f"{_CHECKPOINT_SELECT} WHERE c.uuid = ?", (str(uuid),))
        if not rows:
            raise self._not_found("checkpoint", uuid)
        return _rec.checkpoint_from_row(rows[0])

    def pending_checkpoints_in(self, storage: str) -> list[tuple[str, int, int]]:
        """(uuid, trial id, experiment id) of every trial's checkpoint pending in ``storage``, oldest first."""
        rows = self._read(
            "SELECT c.uuid AS uuid, c.trial_id AS trial_id, t.experiment_id AS experiment_id FROM checkpoints AS c "
            "JOIN trials AS t ON t.id = c.trial_id WHERE c.state = ? AND c.storage = ? ORDER BY c.rowid",
            (CheckpointState.PENDING, str(storage)),
        )
        return [(str(r["uuid"]), int(r["trial_id"]), int(r["experiment_id"])) for r in rows]

    def forked_checkpoints(self) -> set[str]:
        """The checkpoints a fork's trial (``det-trials trial fork``) started from: kept while the fork exists
        (a PBT child, which has a search round, needs its start only until it starts)."""
        rows = self._read("SELECT DISTINCT parent_checkpoint AS uuid FROM trials "
                          "WHERE parent_checkpoint IS NOT NULL AND search_round IS NULL")
        return {str(r["uuid"]) for r in rows}

    def latest_checkpoint(self, trial_id: int) -> CheckpointRecord | None:
        """The trial's most recently reported checkpoint that is not deleted, or ``None``."""
        found = self.checkpoints(trial_id=trial_id)
        return found[-1] if found else None

    # -- summaries (one query each, for dashboards over many trials) ---------------------------------
    def trial_counts(self) -> dict[int, dict[str, int]]:
        """{experiment id: {trial state: number of trials}} over the whole store."""
        out: dict[int, dict[str, int]] = {}
        for r in self._read("SELECT experiment_id, state, COUNT(*) AS n FROM trials GROUP BY experiment_id, state"):
            out.setdefault(r["experiment_id"], {})[r["state"]] = r["n"]
        return out

    def trial_steps(self, experiment_id: int, *, trial_id: int | None = None) -> dict[int, int]:
        """{trial id: the largest ``steps_completed`` it reported} for the experiment's trials (or just
        ``trial_id``) with reports."""
        only = "" if trial_id is None else f" AND t.id = {int(trial_id)}"
        rows = self._read(
            "SELECT t.id AS tid, (SELECT MAX(m.steps_completed) FROM metrics AS m "
            f"WHERE m.trial_id = t.id AND m.{_CURRENT}) AS s "
            f"FROM trials AS t WHERE t.experiment_id = ?{only}", (int(experiment_id),))
        return {r["tid"]: int(r["s"]) for r in rows if r["s"] is not None}

    def metric_points(
        self, experiment_id: int, group: str, metric: str, *, max_rows_per_trial: int | None = None
    ) -> list[tuple[int, int, float]]:
        """(trial id, steps, value) of one metric in one group for each of the experiment's trials, ordered by
        trial, steps and report; missing, non-numeric and NaN values are left out.

        With ``max_rows_per_trial``, a trial with more reports than that is read as an even sample of them (by
        row id, with its first and last report), found by index seeks: an overview of very long series whose
        cost grows with the trials and the sample, not with the reports stored.
        """
        most = max(int(max_rows_per_trial), 2) if max_rows_per_trial else 0
        params = [group, int(experiment_id), _json_path(metric), most][:4 if most else 3]
        which = _SAMPLED_IDS if most else _ALL_IDS
        # ordered here: an ORDER BY steps would walk every report of each trial (the metrics_by_trial index)
        rows = sorted(self._read(_POINTS.format(ids=which), params), key=operator.itemgetter(0, 1, 2))
        points = []
        for tid, steps, _id, value, raw in rows:
            number = _rec.numeric(_rec.loads(raw).get(metric)) if raw is not None else float(value)
            if number is not None:
                points.append((tid, steps, number))
        return points

    def best_by_trial(self, experiment_id: int, metric: str, smaller_is_better: bool, *,
                      trial_id: int | None = None) -> dict[int, float]:
        """{trial id: its best validation value of ``metric``} for the experiment's trials (or just ``trial_id``);
        trials without a usable value are left out."""
        where = ("FROM metrics AS m JOIN trials AS t ON t.id = m.trial_id "
                 f"WHERE t.experiment_id = ? AND m.grp = ? AND m.{_CURRENT}")
        params: tuple[Any, ...] = (int(experiment_id), "validation")
        if trial_id is not None:
            where += " AND m.trial_id = ?"
            params += (int(trial_id),)
        rows = self._read(
            "SELECT tid, MIN(v) AS lo, MAX(v) AS hi FROM (SELECT m.trial_id AS tid, json_extract(m.metrics, ?) AS v "
            f"{where} AND json_valid(m.metrics)) WHERE typeof(v) IN ('integer', 'real') GROUP BY tid",
            (_json_path(metric), *params))
        best = {r["tid"]: float(r["lo"] if smaller_is_better else r["hi"]) for r in rows}
        pick = min if smaller_is_better else max
        for r in self._read(f"SELECT m.trial_id AS tid, m.metrics {where} AND NOT json_valid(m.metrics)", params):
            value = _rec.numeric(_rec.loads(r["metrics"]).get(metric))
            if value is not None:
                best[r["tid"]] = pick(value, best.get(r["tid"], value))
        return best

    def metric_names(self, experiment_id: int, group: str) -> list[str]:
        """The metric names in each trial's latest report of ``group`` (sorted)."""
        rows = self._read(
            f"SELECT (SELECT m.metrics FROM metrics AS m WHERE m.trial_id = t.id AND m.grp = ? AND m.{_CURRENT} "
            "ORDER BY m.steps_completed DESC, m.id DESC LIMIT 1) AS metrics FROM trials AS t WHERE t.experiment_id = ?",
            (group, int(experiment_id)))
        names: set[str] = set()
        for r in rows:
            if r["metrics"] is not None:
                names.update(_rec.loads(r["metrics"]))
        return sorted(names)


def _json_path(key: str) -> str:
    """The SQLite JSON path of a top-level key (quoted, so dots and spaces stay part of the name)."""
    return '$."' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
