"""``det-trials checkpoint ...``: list checkpoints of the run dir, a trial or an experiment."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from determined_trials._format import Column, emit, human_size
from determined_trials.cli import _common

__all__ = ["register"]

_LIST_COLUMNS = [
    Column("uuid", "UUID"),
    Column("experiment_id", "EXPERIMENT"),
    Column("trial_id", "TRIAL"),
    Column("steps_completed", "STEPS"),
    Column("state", "STATE"),
    Column("size", "SIZE"),
    Column("files", "FILES"),
    Column("report_time", "REPORTED"),
    Column("storage", "STORAGE"),
]


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``checkpoint`` command group."""
    group = _common.add_group(commands, "checkpoint", "checkpoints recorded in the run dir")
    listing = _common.add_command(group, "list", _list, "list checkpoints")
    which = listing.add_mutually_exclusive_group()
    which.add_argument("--experiment", type=int, metavar="ID", help="only this experiment's checkpoints")
    which.add_argument("--trial", type=int, metavar="ID", help="only this trial's checkpoints")
    listing.add_argument("--include-deleted", action="store_true", help="also list deleted checkpoints")
    _common.add_output_options(listing)


def _short_storage(storage: str) -> str:
    """A local storage's path (``/abs/path`` or ``directory /abs/path``) relative to the current folder
    when it lies inside it (one long path repeated on every row otherwise); other storages as they are."""
    kind, space, where = storage.partition(" ")
    if not space or storage.startswith("/"):
        kind, where = "", storage
    path = Path(where)
    if not path.is_absolute():
        return storage
    try:
        relative = path.relative_to(Path.cwd())
    except ValueError:
        return storage
    shown = relative.as_posix() if relative.parts else "."
    return f"{kind} {shown}" if kind else shown


def _list(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    found = store.checkpoints(
        trial_id=args.trial, experiment_id=args.experiment, include_deleted=args.include_deleted
    )
    fmt = _common.output_format(args)
    short = fmt == "table" and not args.wide  # a table for a person: sizes in KiB, paths from here
    rows = [
        [c.uuid, c.experiment_id, c.trial_id, c.steps_completed, c.state,
         human_size(c.size) if fmt == "table" else c.size, len(c.resources), c.report_time,
         _short_storage(c.storage) if short else c.storage]
        for c in found
    ]
    emit(sys.stdout, fmt, _LIST_COLUMNS, rows, found, fit=_common.table_width(args), squeeze=("storage",))
    return 0
