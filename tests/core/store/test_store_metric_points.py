"""``LocalStore.metric_points``, the learning curves of the dashboard's experiment page: a trial with at most
``max_rows_per_trial`` reports is read whole, a longer one as an even sample (first and last report kept)
found by index seeks, so the call's cost follows the trials and the sample, not the reports stored."""

from __future__ import annotations

import math
from pathlib import Path

from determined_trials.core.store import _reads
from determined_trials.core.store._local import LocalStore

_CONFIG = {"name": "exp", "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 8}}}


def _store(tmp_path: Path) -> tuple[LocalStore, int]:
    """Trial 1: 1,000 training reports with a validation report every 10th; trial 2: 30 training reports, one
    of them NaN and one without the metric."""
    store = LocalStore(tmp_path / "run")
    exp = store.create_experiment(name="exp", config=_CONFIG)
    long, short = (store.create_trial(experiment_id=exp, hparams={}, seed=s) for s in (1, 2))
    reports = []
    for s in range(1, 1001):
        reports.append({"group": "training", "steps_completed": s, "reported_time": 0.0, "metrics": {"loss": 1 / s}})
        if s % 10 == 0:
            reports.append({"group": "validation", "steps_completed": s, "reported_time": 0.0, "metrics": {"loss": s}})
    store.add_metrics_reports(trial_id=long, reports=reports)
    store.add_metrics_reports(trial_id=short, reports=[
        {"group": "training", "steps_completed": s, "reported_time": 0.0,
         "metrics": {"loss": math.nan} if s == 5 else {"other": 1.0} if s == 6 else {"loss": float(s)}}
        for s in range(1, 31)])
    return store, exp


def test_a_long_trial_is_sampled_evenly_and_a_short_one_read_whole(tmp_path: Path) -> None:
    store, exp = _store(tmp_path)
    points = store.metric_points(exp, "training", "loss", max_rows_per_trial=50)
    long = [s for tid, s, _ in points if tid == 1]
    assert 40 <= len(long) <= 50 and long[0] == 1 and long[-1] == 1000 and long == sorted(long)
    gaps = [b - a for a, b in zip(long, long[1:])]
    assert max(gaps) <= 2 * min(gaps) + 1, gaps  # even: no stretch of the curve left out
    assert all(v == 1 / s for tid, s, v in points if tid == 1)
    short = [(s, v) for tid, s, v in points if tid == 2]
    assert short == [(s, float(s)) for s in range(1, 31) if s not in (5, 6)]  # NaN and missing left out
    every = store.metric_points(exp, "training", "loss")
    assert len([p for p in every if p[0] == 1]) == 1000 and [p for p in every if p[0] == 2] == [
        p for p in points if p[0] == 2]


def test_the_sample_of_a_sparse_group_spans_it(tmp_path: Path) -> None:
    store, exp = _store(tmp_path)  # trial 1's 100 validation reports lie among 1,000 training ones
    steps = [s for tid, s, _ in store.metric_points(exp, "validation", "loss", max_rows_per_trial=20) if tid == 1]
    assert 15 <= len(steps) <= 20 and steps[0] == 10 and steps[-1] == 1000


def test_sampling_seeks_the_index_instead_of_walking_every_report(tmp_path: Path) -> None:
    store, exp = _store(tmp_path)
    sql = _reads._POINTS.format(ids=_reads._SAMPLED_IDS)
    plan = [row[3] for row in store._read("EXPLAIN QUERY PLAN " + sql, ["training", exp, "$.loss", 50])]
    assert not [step for step in plan if step.startswith("SCAN") and "metrics" in step], plan
    assert not [step for step in plan if "metrics_by_group (grp=?)" in step], plan  # a whole group's range
