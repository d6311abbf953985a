"""``det-trials experiment ...``: list the run dir's experiments and describe one."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from typing import Any

import yaml

from determined_trials._format import Column, emit, jsonable, local_time, text
from determined_trials.cli import _common, _search, _trial
from determined_trials.cli._time import write_time
from determined_trials.core.store import Experiment, LocalStore

__all__ = ["register"]

_LIST_COLUMNS = [
    Column("id", "ID"),
    Column("name", "NAME"),
    Column("state", "STATE"),
    Column("trials", "TRIALS"),
    Column("labels", "LABELS"),
    Column("start_time", "STARTED"),
    Column("end_time", "ENDED"),
]


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``experiment`` command group."""
    group = _common.add_group(commands, "experiment", "experiments in the run dir")
    listing = _common.add_command(group, "list", _list, "list experiments")
    _common.add_output_options(listing)
    describe = _common.add_command(group, "describe", _describe, "show one experiment and its trials")
    describe.add_argument("experiment_id", metavar="ID", type=int, help="experiment id")
    describe.add_argument("--json", dest="fmt", action="store_const", const="json", default="table",
                          help="print JSON")
    describe.add_argument("--wide", action="store_true",
                          help="print every table cell whole (by default long ones are cut to fit the terminal)")


def _list(args: argparse.Namespace) -> int:
    from determined_trials.core.store import release_dead_owners

    store = _common.open_store(args)
    release_dead_owners(store)
    experiments = store.experiments()
    counts = Counter(t.experiment_id for t in store.trials())
    rows = [
        [e.id, e.name, e.state, counts[e.id], ",".join(e.labels), e.start_time, e.end_time]
        for e in experiments
    ]
    emit(sys.stdout, _common.output_format(args), _LIST_COLUMNS, rows, experiments,
         fit=_common.table_width(args), squeeze=("labels", "name"))
    return 0


def _searcher_summary(config: dict[str, Any]) -> tuple[str, str | None, bool]:
    """(description, metric, smaller_is_better) of the config's searcher section."""
    searcher = config.get("searcher") if isinstance(config.get("searcher"), dict) else None
    if not searcher:
        return "", None, True
    metric = searcher.get("metric")
    smaller = bool(searcher.get("smaller_is_better", True))
    parts = [str(searcher.get("name", "?"))]
    if metric:
        parts.append(f"metric {metric} ({'smaller' if smaller else 'larger'} is better)")
    if "max_length" in searcher:
        parts.append(f"max_length {text(searcher['max_length'])}")
    return ", ".join(parts), metric, smaller


def _summary_lines(store: LocalStore, exp: Experiment) -> list[tuple[str, str]]:
    searcher, metric, smaller = _searcher_summary(exp.config)
    best = store.best_validation(exp.id, metric, smaller) if metric else None
    state = exp.state + (f" ({exp.reason})" if exp.reason else "")
    pairs = [
        ("name", exp.name),
        ("state", state),
        ("description", exp.description),
        ("labels", ", ".join(exp.labels)),
        ("model dir", exp.model_dir or ""),
        ("started", local_time(exp.start_time)),
        ("ended", local_time(exp.end_time)),
        ("searcher", searcher),
        ("warm start", _warm_start_line(exp)),
        ("study told", _study_line(exp)),
        ("best validation", "" if best is None else f"{metric} = {text(best)}"),
        ("best trial", _search.best_trial_line(store, exp)),
        ("checkpoints", str(len(store.checkpoints(experiment_id=exp.id)))),
    ]
    return [(k, v) for k, v in pairs if v]


def _warm_start_line(exp: Experiment) -> str:
    """Where a warm-started experiment's trials start (``searcher.source_trial_id`` / ``source_checkpoint_uuid``,
    as the runner resolved it), else ""."""
    warm = (exp.searcher_state or {}).get("warm_start")
    if not warm:
        return ""
    trial = f" (trial {warm['trial_id']})" if warm.get("trial_id") is not None else ""
    return f"every trial from the model weights of checkpoint {warm['checkpoint']}{trial}"


def _study_line(exp: Experiment) -> str:
    """The earlier experiments an optuna search's study was told (``searcher.warm_start``), else ""."""
    searcher = exp.config.get("searcher") or {}
    earlier = (searcher.get("warm_start") or {}).get("experiments") if searcher.get("name") == "optuna" else None
    if not earlier:
        return ""
    return f"the completed trials of experiment(s) {', '.join(str(e) for e in dict.fromkeys(earlier))}"


def _describe(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    exp = store.experiment(args.experiment_id)
    trials = store.trials(exp.id)
    spent = store.experiment_time(exp.id, now=time.time())
    if _common.output_format(args) == "json":
        record = jsonable(exp)
        record["time"] = spent
        record["trials"] = jsonable(trials)
        record["checkpoints"] = jsonable(store.checkpoints(experiment_id=exp.id))
        record["best_trial"] = jsonable(_search.best_trial(store, exp))
        sys.stdout.write(json.dumps(record, indent=2, allow_nan=False) + "\n")
        return 0
    out = sys.stdout
    out.write(f"Experiment {exp.id}\n")
    pairs = _summary_lines(store, exp)
    width = max(len(k) for k, _ in pairs)
    out.writelines(f"  {k + ':':<{width + 1}} {v}\n" for k, v in pairs)
    out.write(f"\nTrials ({len(trials)}):\n")
    _trial.write_trial_table(out, trials, fit=_common.table_width(args))
    _search.write_lineage(out, store, exp, trials, fit=_common.table_width(args))
    write_time(out, spent, "Time (seconds, summed over the trials; goodput: the share that was training)")
    out.write("\nConfig:\n")
    out.write(yaml.safe_dump(jsonable(exp.config), sort_keys=False, default_flow_style=False))
    return 0
