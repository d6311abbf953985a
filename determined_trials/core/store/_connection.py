"""The store's connection: one SQLite connection per process, used by one thread at a time, and the write primitives."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from determined_trials.core.store import _schema
from determined_trials.core.store._reads import StoreReads

__all__ = ["StoreConnection"]


class StoreConnection(StoreReads):
    """This process's connection to ``db_path`` (reopened after ``fork``) and the short writes built on it."""

    _pid: int
    _conn_: sqlite3.Connection | None
    _lock: threading.RLock

    @contextlib.contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        """This process's connection, held exclusively by the calling thread."""
        pid = os.getpid()
        if pid != self._pid:
            # A forked child must not touch the parent's connection or lock: start afresh.
            self._lock = threading.RLock()
            self._conn_ = None
            self._pid = pid
        with self._lock:
            if self._conn_ is None:
                try:
                    self._conn_ = _schema.connect(self.db_path)
                except sqlite3.DatabaseError as exc:
                    raise RuntimeError(f"{self.db_path} is not a usable store: {exc}") from exc
            yield self._conn_

    def close(self) -> None:
        """Close this process's connection (the store reopens it on the next call)."""
        with self._lock:
            if self._conn_ is not None and self._pid == os.getpid():
                self._conn_.close()
            self._conn_ = None

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._locked() as conn:
            return conn.execute(sql, tuple(params)).fetchall()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A short write transaction; BEGIN IMMEDIATE takes the write lock up front (waits if busy)."""
        with self._locked() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _update(self, kind: str, key: object, sql: str, params: Sequence[Any]) -> None:
        """Run one UPDATE that must touch exactly the row ``key`` of ``kind``."""
        with self._locked() as conn:
            if conn.execute(sql, tuple(params)).rowcount == 0:
                raise self._not_found(kind, key)

    def _insert(self, parent: tuple[str, object], sql: str, params: Sequence[Any]) -> int:
        """Run one INSERT; a missing parent row (foreign key) becomes :class:`NotFoundError`."""
        with self._locked() as conn:
            try:
                cursor = conn.execute(sql, tuple(params))
            except sqlite3.IntegrityError as exc:
                if "FOREIGN KEY" in str(exc):
                    raise self._not_found(*parent) from None
                raise
            assert cursor.lastrowid is not None
            return cursor.lastrowid
