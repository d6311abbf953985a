"""The states the store records: ``RunState`` (experiments and trials) and ``CheckpointState``, ``str`` enums.

A member is its value wherever a string goes, byte for byte: SQLite stores it, the CLI prints it and the
dashboard serves it as the plain text (``"ACTIVE"``, ...), and the raw strings read back compare equal to
the members (and find them in ``RunState.TERMINAL`` / ``RunState.UNFINISHED``). ``enum.StrEnum`` is Python
3.11+, hence ``str, enum.Enum`` with ``__str__`` and ``__format__`` pinned to the value (3.10 to 3.13 alike).
"""

from __future__ import annotations

import enum
from typing import ClassVar

__all__ = ["CheckpointState", "RunState"]


class _StoredState(str, enum.Enum):
    """A state stored as text: ``str()``, f-strings and ``format()`` give the value; ``==`` and ``hash`` are
    ``str``'s; ``json`` and ``sqlite3`` take the member as the plain string."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class RunState(_StoredState):
    """The state of an experiment or a trial (``experiments.state``, ``trials.state``): both go through the
    same states, and a plain script's experiment ends as its one trial does. Not ``loop.Clock`` (the
    training counters) nor a trial's ``status`` (the free-text line ``TrainContext.set_status`` writes)."""

    TERMINAL: ClassVar[frozenset[RunState]]  # ended for good: the store stamps the end time
    UNFINISHED: ClassVar[frozenset[RunState]]  # running or resumable: what `experiment kill` cancels

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    ERROR = "ERROR"
    CANCELED = "CANCELED"


class CheckpointState(_StoredState):
    """A checkpoint row's state (``checkpoints.state``): PENDING while it is written (invisible to reads),
    COMPLETED once published, DELETED once its files are gone (the row stays)."""

    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    DELETED = "DELETED"


RunState.TERMINAL = frozenset({RunState.COMPLETED, RunState.ERROR, RunState.CANCELED})
RunState.UNFINISHED = frozenset({RunState.ACTIVE, RunState.PAUSED})
