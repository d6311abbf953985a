"""Whether the run folder the dashboard opened is still there: its store file, by identity (device and inode), so a
folder deleted or replaced (by an empty store, say) while the server runs is said, not served from the old file."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = ["CHECK_EVERY_S", "StoreWatch"]

CHECK_EVERY_S = 0.5  # the longest the dashboard answers from a store that is gone


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


class StoreWatch:
    """Notices that ``db_path`` was deleted or replaced since the watch began (one ``stat`` at most every
    ``CHECK_EVERY_S``); once gone, it stays gone: the open connection still reads the old file."""

    def __init__(self, db_path: Path, run_dir: Path) -> None:
        self._path = db_path
        self._run_dir = run_dir
        self._identity = _identity(db_path)
        self._checked_at = time.monotonic()
        self._gone: str | None = None
        self._lock = threading.Lock()

    def gone(self) -> str | None:
        """The message saying the run folder is gone, or None while its store is the one opened."""
        now = time.monotonic()
        if self._gone is not None or now - self._checked_at < CHECK_EVERY_S:
            return self._gone
        with self._lock:
            self._checked_at = now
            identity = _identity(self._path)
            if identity != self._identity:
                how = "deleted" if identity is None else "replaced"
                self._gone = (f"the run folder {self._run_dir} was {how} while det-trials ui ran (its store.sqlite "
                              "is not the one opened): restart det-trials ui")
        return self._gone
