"""Opening a store file written by an older version adds the columns released since, and records the version."""

from __future__ import annotations

from pathlib import Path

import pytest

from determined_trials.core.store import _schema


def test_an_older_file_gets_the_added_columns_and_the_new_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db_path = tmp_path / "store.sqlite"
    conn = _schema.connect(db_path)
    _schema.ensure_schema(conn, db_path)
    conn.execute("INSERT INTO experiments (name, config, start_time) VALUES ('old', '{}', 0)")

    monkeypatch.setattr(_schema, "_ADDED_COLUMNS", [("experiments", "added_later", "TEXT DEFAULT 'x'")])
    monkeypatch.setattr(_schema, "SCHEMA_VERSION", _schema.SCHEMA_VERSION + 1)
    _schema.ensure_schema(conn, db_path)

    row = conn.execute("SELECT name, added_later FROM experiments").fetchone()
    assert (row["name"], row["added_later"]) == ("old", "x")
    assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == _schema.SCHEMA_VERSION
    _schema.ensure_schema(conn, db_path)  # a second open is a no-op, not a duplicate-column error
    conn.close()


def test_a_version_4_tracker_run_reads_no_recorded_checkpoints_then_records_them(tmp_path: Path) -> None:
    """Schema 4's ``tracker_runs`` had no ``checkpoints_forwarded`` (nor schema 5's ``progress``): the run opens with
    none recorded and an empty progress, and a checkpoint added is listed once however often it is added."""
    from determined_trials.core.store._local import LocalStore

    db_path = tmp_path / "store.sqlite"
    conn = _schema.connect(db_path)
    _schema.ensure_schema(conn, db_path)
    conn.execute("INSERT INTO experiments (name, config, start_time) VALUES ('old', '{}', 0)")
    conn.execute("INSERT INTO trials (experiment_id, hparams, seed, start_time) VALUES (1, '{}', 0, 0)")
    conn.execute("ALTER TABLE tracker_runs DROP COLUMN checkpoints_forwarded")
    conn.execute("ALTER TABLE tracker_runs DROP COLUMN progress")
    conn.execute("INSERT INTO tracker_runs (trial_id, tracker, run_id) VALUES (1, 'mlflow', 'r1')")
    conn.execute("DELETE FROM schema_version WHERE version > 4")
    conn.close()

    store = LocalStore(tmp_path)
    assert store.tracker_run(1, "mlflow") == {"run_id": "r1", "url": None, "forwarded_id": 0, "checkpoints": [],
                                              "progress": {}}
    for uuid in ("a", "b", "a"):
        store.add_tracker_checkpoint(1, "mlflow", uuid)
    assert store.tracker_runs(1)["mlflow"]["checkpoints"] == ["a", "b"]
