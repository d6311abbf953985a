"""One timeline per trial in the store: reports a restart replaced are marked superseded, hidden from every
metrics read, kept for audit (``include_superseded``), and an older store file gets the column when opened."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from determined_trials.core.store import _schema
from determined_trials.core.store._local import LocalStore, NotFoundError

# The tables of schema 1 that the upgrade test fills, as released (the others are created when the file is opened)
_SCHEMA_1 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE experiments (
    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, description TEXT NOT NULL DEFAULT '',
    labels TEXT NOT NULL DEFAULT '[]', config TEXT NOT NULL, model_dir TEXT, state TEXT NOT NULL DEFAULT 'ACTIVE',
    reason TEXT, searcher_state TEXT, start_time REAL NOT NULL, end_time REAL);
CREATE TABLE trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT, experiment_id INTEGER NOT NULL REFERENCES experiments(id),
    hparams TEXT NOT NULL, seed INTEGER NOT NULL, state TEXT NOT NULL DEFAULT 'ACTIVE', reason TEXT, status TEXT,
    metadata TEXT NOT NULL DEFAULT '{}', progress REAL, early_exit_reason TEXT,
    restarts INTEGER NOT NULL DEFAULT 0, start_time REAL NOT NULL, end_time REAL);
CREATE TABLE metrics (
    id INTEGER PRIMARY KEY AUTOINCREMENT, trial_id INTEGER NOT NULL REFERENCES trials(id), grp TEXT NOT NULL,
    steps_completed INTEGER NOT NULL, metrics TEXT NOT NULL, batch_metrics TEXT, reported_time REAL NOT NULL);
"""
_CONFIG = {"name": "exp", "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 8}}}


def _report(store: LocalStore, trial_id: int, steps: range, loss: float) -> None:
    for s in steps:
        store.add_metrics(trial_id=trial_id, group="training", steps_completed=s, metrics={"loss": loss + s})
        if s % 2 == 0:
            store.add_metrics(trial_id=trial_id, group="validation", steps_completed=s, metrics={"loss": loss + s})


@pytest.fixture
def restarted(tmp_path: Path) -> tuple[LocalStore, int, int]:
    """A trial whose first attempt reported steps 1-6, then resumed from its checkpoint at step 3 and reported
    4-8 with other values; returns the store, the experiment id and the trial id."""
    store = LocalStore(tmp_path / "run")
    exp = store.create_experiment(name="exp", config=_CONFIG)
    trial = store.create_trial(experiment_id=exp, hparams={}, seed=1)
    _report(store, trial, range(1, 7), loss=100.0)  # the lost attempt: its 4..6 are reported again below
    assert store.supersede_metrics_after(trial, 3) == 3 + 2  # training 4, 5, 6 and validation 4, 6
    _report(store, trial, range(4, 9), loss=0.0)
    return store, exp, trial


def test_reads_show_one_timeline(restarted: tuple[LocalStore, int, int]) -> None:
    store, exp, trial = restarted
    training = store.metrics(trial, "training")
    assert [r.steps_completed for r in training] == list(range(1, 9))
    assert [r.metrics["loss"] for r in training] == [101.0, 102.0, 103.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert all(r.superseded_time is None for r in training)
    assert [r.steps_completed for r in store.metrics(trial, "validation")] == [2, 4, 6, 8]
    assert store.trial_steps(exp) == {trial: 8}
    assert [s for _, s, _ in store.metric_points(exp, "validation", "loss")] == [2, 4, 6, 8]
    sampled = store.metric_points(exp, "training", "loss", max_rows_per_trial=2)
    assert sampled[0][1:] == (1, 101.0) and sampled[-1][1:] == (8, 8.0)
    assert all(value == (100.0 + s if s <= 3 else float(s)) for _, s, value in sampled)  # no lost report
    # the lost attempt's losses (104, 106) are larger: the best of the timeline ignores them either way
    assert store.best_validation(exp, "loss", smaller_is_better=False) == 102.0
    assert store.best_by_trial(exp, "loss", smaller_is_better=False) == {trial: 102.0}
    assert store.metric_names(exp, "validation") == ["loss"]
    assert store.metric_groups(trial) == ["training", "validation"]


def test_superseded_reports_stay_for_audit(restarted: tuple[LocalStore, int, int]) -> None:
    store, _, trial = restarted
    every = store.metrics(trial, "training", include_superseded=True)
    assert [r.steps_completed for r in every] == [1, 2, 3, 4, 4, 5, 5, 6, 6, 7, 8]
    lost = [r for r in every if r.superseded_time is not None]
    assert [(r.steps_completed, r.metrics["loss"]) for r in lost] == [(4, 104.0), (5, 105.0), (6, 106.0)]
    assert len({r.superseded_time for r in lost}) == 1  # marked together, when the attempt resumed
    assert all(r.superseded_time is not None and r.superseded_time >= r.reported_time for r in lost)


def test_supersede_everything_and_unknown_trial(restarted: tuple[LocalStore, int, int]) -> None:
    store, exp, trial = restarted
    assert store.supersede_metrics_after(trial, None) == 8 + 4  # a start over without a checkpoint
    assert store.metrics(trial) == [] and store.metric_groups(trial) == []
    assert store.trial_steps(exp) == {} and store.best_validation(exp, "loss", smaller_is_better=True) is None
    with pytest.raises(NotFoundError, match="trial 99"):
        store.supersede_metrics_after(99, 0)
    with pytest.raises(ValueError, match="non-negative"):
        store.supersede_metrics_after(trial, -1)


def test_an_older_store_file_gets_the_column(tmp_path: Path) -> None:
    """A store written before superseded reports existed (schema 1, no column) opens, keeps its reports
    current, and can then mark some."""
    db_path = tmp_path / "store.sqlite"
    conn = sqlite3.connect(db_path)
    conn.executescript(_SCHEMA_1)
    conn.execute("INSERT INTO schema_version (version) VALUES (1)")
    conn.execute("INSERT INTO experiments (name, config, start_time) VALUES ('old', '{}', 0)")
    conn.execute("INSERT INTO trials (experiment_id, hparams, seed, start_time) VALUES (1, '{}', 0, 0)")
    conn.executemany("INSERT INTO metrics (trial_id, grp, steps_completed, metrics, reported_time) "
                     "VALUES (1, 'training', ?, '{\"loss\": 1}', 0)", [(1,), (2,)])
    conn.commit()
    conn.close()

    store = LocalStore(tmp_path)
    assert [r.steps_completed for r in store.metrics(1)] == [1, 2]
    assert store.supersede_metrics_after(1, 1) == 1
    assert [r.steps_completed for r in store.metrics(1)] == [1]
    versions = [r[0] for r in sqlite3.connect(db_path).execute("SELECT version FROM schema_version")]
    assert versions == [1, _schema.SCHEMA_VERSION]
