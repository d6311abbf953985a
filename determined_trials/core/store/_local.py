"""``LocalStore``: the SQLite database in a run dir that plays the cluster master's part.

It records experiments, trials, metrics, checkpoints and searcher progress; several processes may
write at once (WAL journal, busy timeout, short transactions, one connection per process).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from determined_trials.core.store import _schema
from determined_trials.core.store._records import (
    CheckpointRecord,
    Experiment,
    MetricRecord,
    NotFoundError,
    SearcherOpRecord,
    Trial,
)
from determined_trials.core.store._result_writes import ResultWrites
from determined_trials.core.store._run_writes import RunWrites
from determined_trials.core.store._tracker_runs import TrackerRuns
from determined_trials.core.store._trial_time import TrialTimes

__all__ = [
    "CheckpointRecord",
    "Experiment",
    "LocalStore",
    "MetricRecord",
    "NotFoundError",
    "SearcherOpRecord",
    "Trial",
]

STORE_FILENAME = "store.sqlite"


class LocalStore(RunWrites, ResultWrites, TrackerRuns, TrialTimes):
    """The run dir's database: write methods for the Core API, read methods for users and the CLI.

    Safe to share across threads and across ``fork``: each process opens its own connection on
    first use. Missing ids raise :class:`NotFoundError`, a ``KeyError`` naming the id and the file.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, create: bool = True) -> None:
        """Open the store in ``run_dir``; with ``create`` (default) make the folder and schema if missing."""
        self.path = Path(run_dir).expanduser().absolute()
        self.db_path = self.path / STORE_FILENAME
        if create:
            self.path.mkdir(parents=True, exist_ok=True)
        elif not self.db_path.is_file():
            where = "has no store" if self.path.is_dir() else "does not exist"
            raise FileNotFoundError(
                f"run dir {self.path} {where} ({STORE_FILENAME} missing); pass the run dir an "
                "experiment wrote to (--run-dir or DET_RUN_DIR)"
            )
        self._pid = -1
        self._conn_ = None
        self._lock = threading.RLock()
        with self._locked() as conn:
            try:
                _schema.ensure_schema(conn, self.db_path)
            except sqlite3.DatabaseError as exc:
                raise RuntimeError(f"{self.db_path} is not a usable store: {exc}") from exc

    def __repr__(self) -> str:
        return f"LocalStore({str(self.path)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the run dir only (e.g. to hand the store to a spawned process)."""
        return (LocalStore, (str(self.path),))
