"""StagedCheckpoint: a chief's checkpoint between writing its files and publishing them, so that the
publish (fsync, commit, record) may run later, e.g. on a background thread; StagedShard: the same for
every rank's part of a sharded checkpoint."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

__all__ = ["StagedCheckpoint", "StagedShard"]


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


@dataclasses.dataclass(frozen=True)
class StagedShard:
    """This rank's files of sharded checkpoint ``storage_id``, written into ``path``. Every rank calls
    exactly one of ``collect()`` and ``abort()``, once, on the thread that runs its collectives."""

    path: Path
    storage_id: str
    _collect: Callable[[], Callable[[], str] | None]
    _abort: Callable[[], None]

    def collect(self) -> Callable[[], str] | None:
        """A collective: check and stage every rank's files (raising on every rank if any failed). Returns,
        on the chief, the commit (publish and record; any thread, returns the storage id); None elsewhere."""
        return self._collect()

    def abort(self) -> None:
        """A collective: nothing is stored and every rank raises."""
        self._abort()
