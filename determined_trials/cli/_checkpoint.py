"""``det-trials checkpoint ...``: list checkpoints of the run dir, a trial or an experiment."""

from __future__ import annotations

import argparse
import sys

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


def _list(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    found = store.checkpoints(
        trial_id=args.trial, experiment_id=args.experiment, include_deleted=args.include_deleted
    )
    fmt = _common.output_format(args)
    rows = [
        [c.uuid, c.experiment_id, c.trial_id, c.steps_completed, c.state,
         human_size(c.size) if fmt == "table" else c.size, len(c.resources), c.report_time, c.storage]
        for c in found
    ]
    emit(sys.stdout, fmt, _LIST_COLUMNS, rows, found)
    return 0
