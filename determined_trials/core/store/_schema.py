"""The local store's SQLite schema and how a process opens it (WAL, busy timeout, idempotent creation)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

__all__ = ["BUSY_TIMEOUT_S", "SCHEMA_VERSION", "connect", "ensure_schema"]

SCHEMA_VERSION = 6
BUSY_TIMEOUT_S = 60.0

# Columns added after a table was first released: (table, column, declaration). A file written by an older
# version gets each missing one by ALTER TABLE when it is opened (new tables come from `_TABLES` itself).
_ADDED_COLUMNS: list[tuple[str, str, str]] = [
    ("trials", "parent_trial_id", "INTEGER"),  # PBT lineage: the trial whose checkpoint this one started from,
    ("trials", "parent_checkpoint", "TEXT"),  # that checkpoint's uuid,
    ("trials", "search_round", "INTEGER"),  # and the round (from 1) it started in
    ("metrics", "superseded_time", "REAL"),
    ("tracker_runs", "checkpoints_forwarded", "TEXT NOT NULL DEFAULT '[]'"),  # uuids the tracker has recorded
    ("tracker_runs", "progress", "TEXT NOT NULL DEFAULT '{}'"),  # what of the trial's rows the run holds (JSON)
]

# The state columns hold ``_states``' values; their defaults are the first states
# (tests/core/store/test_states.py checks).
_TABLES = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS experiments (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    name           TEXT NOT NULL,
    description    TEXT NOT NULL DEFAULT '',
    labels         TEXT NOT NULL DEFAULT '[]',
    config         TEXT NOT NULL,
    model_dir      TEXT,
    state          TEXT NOT NULL DEFAULT 'ACTIVE',
    reason         TEXT,
    searcher_state TEXT,
    start_time     REAL NOT NULL,
    end_time       REAL
);
CREATE TABLE IF NOT EXISTS trials (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    experiment_id     INTEGER NOT NULL REFERENCES experiments(id),
    hparams           TEXT NOT NULL,
    seed              INTEGER NOT NULL,
    state             TEXT NOT NULL DEFAULT 'ACTIVE',
    reason            TEXT,
    status            TEXT,
    metadata          TEXT NOT NULL DEFAULT '{}',
    progress          REAL,
    early_exit_reason TEXT,
    restarts          INTEGER NOT NULL DEFAULT 0,
    start_time        REAL NOT NULL,
    end_time          REAL,
    parent_trial_id   INTEGER,
    parent_checkpoint TEXT,
    search_round      INTEGER
);
CREATE INDEX IF NOT EXISTS trials_by_experiment ON trials(experiment_id, id);
CREATE TABLE IF NOT EXISTS metrics (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    trial_id        INTEGER NOT NULL REFERENCES trials(id),
    grp             TEXT NOT NULL,
    steps_completed INTEGER NOT NULL,
    metrics         TEXT NOT NULL,
    batch_metrics   TEXT,
    reported_time   REAL NOT NULL,
    superseded_time REAL  -- when a restart from an earlier checkpoint replaced the report (NULL: current)
);
CREATE INDEX IF NOT EXISTS metrics_by_trial ON metrics(trial_id, steps_completed, id);
CREATE INDEX IF NOT EXISTS metrics_by_group ON metrics(grp, trial_id);
CREATE TABLE IF NOT EXISTS checkpoints (
    uuid            TEXT PRIMARY KEY,
    trial_id        INTEGER REFERENCES trials(id),
    steps_completed INTEGER NOT NULL,
    metadata        TEXT NOT NULL,
    resources       TEXT NOT NULL,
    storage         TEXT NOT NULL,
    state           TEXT NOT NULL DEFAULT 'COMPLETED',
    report_time     REAL NOT NULL,
    delete_time     REAL
);
CREATE INDEX IF NOT EXISTS checkpoints_by_trial ON checkpoints(trial_id);
CREATE TABLE IF NOT EXISTS searcher_ops (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    trial_id      INTEGER NOT NULL REFERENCES trials(id),
    length        INTEGER NOT NULL,
    metric        REAL,
    completed     INTEGER NOT NULL,
    reported_time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS searcher_ops_by_trial ON searcher_ops(trial_id, id);
CREATE TABLE IF NOT EXISTS tracker_runs (
    trial_id     INTEGER NOT NULL REFERENCES trials(id),
    tracker      TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    url          TEXT,
    forwarded_id INTEGER NOT NULL DEFAULT 0,
    checkpoints_forwarded TEXT NOT NULL DEFAULT '[]',
    progress     TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (trial_id, tracker)
);
CREATE TABLE IF NOT EXISTS trial_time (
    trial_id INTEGER NOT NULL REFERENCES trials(id),
    part     TEXT NOT NULL,  -- a part of _trial_time.TIME_PARTS, wall, or the marks _reached and _open
    seconds  REAL NOT NULL,
    PRIMARY KEY (trial_id, part)
);
"""


def connect(db_path: Path) -> sqlite3.Connection:
    """Open ``db_path`` for this process: autocommit mode (we issue BEGIN), WAL, busy timeout, FKs on."""
    conn = sqlite3.connect(
        str(db_path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    conn.execute("PRAGMA foreign_keys = ON")
    _enable_wal(conn)
    # In WAL mode NORMAL keeps the database consistent on a crash; only the last commits may be lost
    # on power failure, which is the right trade for metrics written many times a second.
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def _enable_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL (persistent). Switching needs a moment of exclusive access, so retry."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() == "wal":
                return
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _stored_version(conn: sqlite3.Connection) -> int | None:
    """The schema version recorded in the file, or ``None`` when the schema is not there yet."""
    try:
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return None if row is None or row[0] is None else int(row[0])


def ensure_schema(conn: sqlite3.Connection, db_path: Path) -> None:
    """Create the tables if they are missing (safe when several processes do it at once)."""
    version = _stored_version(conn)
    if version == SCHEMA_VERSION:
        return
    if version is not None and version > SCHEMA_VERSION:
        raise RuntimeError(
            f"{db_path} was written by a newer determined_trials (store schema {version}, this one "
            f"reads {SCHEMA_VERSION}); upgrade determined_trials or use another run dir"
        )
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in _TABLES.split(";"):
            if statement.strip():
                conn.execute(statement)
        _add_missing_columns(conn)
        if (_stored_version(conn) or 0) < SCHEMA_VERSION:
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """Upgrade a file written by an older version: add each column of `_ADDED_COLUMNS` it lacks."""
    for table, column, declaration in _ADDED_COLUMNS:
        present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
