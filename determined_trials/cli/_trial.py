"""``det-trials trial ...``: list trials and print a trial's metrics (table, CSV or JSON)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from determined_trials._format import Column, emit, flat_hparams, table
from determined_trials.cli import _common
from determined_trials.core.store import MetricRecord, RunState, Trial

__all__ = ["register", "write_trial_table"]

_LIST_COLUMNS = [
    Column("id", "ID"),
    Column("experiment_id", "EXPERIMENT"),
    Column("state", "STATE"),
    Column("seed", "SEED"),
    Column("progress", "PROGRESS"),
    Column("restarts", "RESTARTS"),
    Column("status", "STATUS"),
    Column("hparams", "HPARAMS"),
    Column("start_time", "STARTED"),
    Column("end_time", "ENDED"),
]


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``trial`` command group."""
    group = _common.add_group(commands, "trial", "trials and their metrics")
    listing = _common.add_command(group, "list", _list, "list trials")
    listing.add_argument("--experiment", type=int, metavar="ID", help="only this experiment's trials")
    _common.add_output_options(listing)
    metrics = _common.add_command(group, "metrics", _metrics, "print a trial's reported metrics")
    metrics.add_argument("trial_id", metavar="TRIAL_ID", type=int, help="trial id")
    metrics.add_argument("--group", metavar="G", help='only this group (e.g. "training", "validation")')
    metrics.add_argument("--all-attempts", action="store_true",
                         help="also the reports of lost attempts that a restart from an earlier checkpoint "
                              "superseded (column SUPERSEDED: when)")
    _common.add_output_options(metrics)


def _trial_row(t: Trial) -> list[Any]:
    status = (t.status or "") if t.state == RunState.ACTIVE else ""  # what a running trial is doing, only
    if t.early_exit_reason:
        status = f"{status} [early exit: {t.early_exit_reason}]".strip()
    return [t.id, t.experiment_id, t.state, t.seed, t.progress, t.restarts, status,
            " ".join(flat_hparams(t.hparams)), t.start_time, t.end_time]


_SQUEEZE = ("hparams", "status")  # cut first when a table is wider than the terminal


def write_trial_table(out: TextIO, trials: Sequence[Trial], fit: int | None = None) -> None:
    """The text table of ``trials`` (also used by ``experiment describe``), fitted to ``fit`` characters."""
    out.write(table(_LIST_COLUMNS, [_trial_row(t) for t in trials], fit=fit, squeeze=_SQUEEZE))


def _list(args: argparse.Namespace) -> int:
    from determined_trials.core.store import release_dead_owners

    store = _common.open_store(args)
    release_dead_owners(store)  # trials of a killed runner or script show as PAUSED (resumable)
    trials = store.trials(args.experiment)
    emit(sys.stdout, _common.output_format(args), _LIST_COLUMNS, [_trial_row(t) for t in trials], trials,
         fit=_common.table_width(args), squeeze=_SQUEEZE)
    return 0


def _metric_keys(records: Sequence[MetricRecord]) -> list[str]:
    """Every metric name reported, in order of first appearance."""
    keys: dict[str, None] = {}
    for record in records:
        keys.update(dict.fromkeys(record.metrics))
    return list(keys)


def _metrics(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    records = store.metrics(args.trial_id, args.group, include_superseded=args.all_attempts)
    keys = _metric_keys(records)
    columns = [Column("steps_completed", "STEPS"), Column("group", "GROUP")]
    columns += [Column(k, k) for k in keys]
    rows = [[r.steps_completed, r.group, *(r.metrics.get(k) for k in keys)] for r in records]
    if args.all_attempts:
        columns.append(Column("superseded_time", "SUPERSEDED"))
        for row, record in zip(rows, records):
            row.append(record.superseded_time)
    emit(sys.stdout, _common.output_format(args), columns, rows, records)
    return 0
