"""Each trial's time parts in the store: added up as they come, the batches reached kept as a maximum, the
runner's open attempt counting up to the time it is read, the breakdown and the experiment's sum; a store of
schema 5 (before ``trial_time``) gets the table when opened."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from determined_trials.core.store import TIME_PARTS, LocalStore, _schema, summed_time, time_breakdown


def _trial(store: LocalStore) -> int:
    exp = store.create_experiment(name="t", config={})
    return store.create_trial(experiment_id=exp, hparams={}, seed=1)


def test_parts_add_up_and_other_is_the_wall_they_leave(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    trial = _trial(store)
    store.set_trial_attempt(trial, 100.0)
    store.add_trial_time(trial, {"queued": 1.0, "start": 2.0}, batches_reached=10)
    store.add_trial_time(trial, {"train": 3.0, "start": 0.5}, batches_reached=7)  # an earlier reach never lowers it
    assert store.batches_reached(trial) == 10
    running = store.trial_time(trial, now=110.0)  # the attempt is open: wall up to now
    assert (running["wall"], running["start"], running["other"]) == (10.0, 2.5, 10.0 - 6.5)
    store.set_trial_state(trial, "PAUSED")  # its runner was killed -9: the open attempt no longer counts up
    assert store.trial_time(trial, now=500.0)["wall"] == 6.5  # (the parts' sum)
    store.set_trial_state(trial, "ACTIVE")
    store.end_trial_attempt(trial, ended=108.0)
    ended = store.trial_time(trial, now=1000.0)  # closed: the time since does not count
    assert ended["wall"] == 8.0 and ended["other"] == pytest.approx(1.5)
    assert sum(ended[p] for p in (*TIME_PARTS, "other")) == pytest.approx(ended["wall"])
    with pytest.raises(ValueError, match="unknown time part"):
        store.add_trial_time(trial, {"sleeping": 1.0})


def test_a_trial_no_runner_ran_has_the_wall_of_its_parts_and_the_sum_has_the_goodput() -> None:
    plain = time_breakdown({"build": 1.0, "train": 3.0}, now=0.0)
    assert (plain["wall"], plain["other"]) == (4.0, 0.0)
    total = summed_time([plain, time_breakdown({"train": 1.0, "wall": 4.0}, now=0.0)])
    assert (total["wall"], total["train"], total["other"], total["goodput"]) == (8.0, 4.0, 3.0, 0.5)
    assert summed_time([])["goodput"] == 0.0


def test_the_experiment_sums_its_own_trials_only_and_deleting_it_deletes_their_time(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    first, other = _trial(store), _trial(store)
    store.add_trial_time(first, {"train": 2.0, "wall": 4.0})
    store.add_trial_time(other, {"train": 9.0, "wall": 9.0})
    summed = store.experiment_time(store.trial(first).experiment_id, now=0.0)
    assert (summed["train"], summed["wall"], summed["goodput"]) == (2.0, 4.0, 0.5)
    store.delete_experiment(store.trial(first).experiment_id)  # its trials' time goes with it
    assert store.experiment_time(store.trial(other).experiment_id, now=0.0)["train"] == 9.0


def test_a_schema_5_store_gets_the_time_table(tmp_path: Path) -> None:
    db_path = tmp_path / "store.sqlite"
    conn = _schema.connect(db_path)
    _schema.ensure_schema(conn, db_path)
    conn.execute("DROP TABLE trial_time")
    conn.execute("DELETE FROM schema_version")
    conn.execute("INSERT INTO schema_version (version) VALUES (5)")
    conn.execute("INSERT INTO experiments (name, config, start_time) VALUES ('old', '{}', 0)")
    conn.execute("INSERT INTO trials (experiment_id, hparams, seed, start_time) VALUES (1, '{}', 0, 0)")
    conn.close()
    store = LocalStore(tmp_path)
    assert store.trial_time(1, now=0.0)["wall"] == 0.0  # nothing recorded yet: no error
    store.add_trial_time(1, {"train": 1.5})
    assert store.trial_time(1, now=0.0)["train"] == 1.5
    with sqlite3.connect(db_path) as check:
        assert check.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == _schema.SCHEMA_VERSION
