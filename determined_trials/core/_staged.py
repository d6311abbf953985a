"""StagedCheckpoint: a chief's checkpoint between writing its files and publishing them, so that the
publish (fsync, commit, record) may run later, e.g. on a background thread."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

__all__ = ["StagedCheckpoint"]


@dataclasses.dataclass(frozen=True)
class StagedCheckpoint:
    """Files written into ``path`` become checkpoint ``storage_id`` at ``publish()`` (complete or not at
    all); ``abort()`` removes them. Exactly one of the two must be called, once."""

    path: Path
    storage_id: str
    _publish: Callable[[], None]
    _abort: Callable[[], None]

    def publish(self) -> str:
        """Stage, commit and record what was written (any thread); return the storage id."""
        self._publish()
        return self.storage_id

    def abort(self) -> None:
        """Drop what was written and the pending record."""
        self._abort()
