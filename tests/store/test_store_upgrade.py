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
