"""``det-trials experiment kill|delete`` and ``trial describe``: the management commands Determined
users type (added to the existing command groups)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from determined_trials._format import flat_hparams, jsonable, local_time, text
from determined_trials.cli import _common, _search
from determined_trials.cli._run import checkpoint_storage_for, group_of
from determined_trials.cli._time import write_time
from determined_trials.core.store import LocalStore, RunState, release_dead_owners

__all__ = ["register"]

_T = TypeVar("_T")


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``experiment kill|delete`` and ``trial describe``."""
    experiment = group_of(commands, "experiment")
    kill = _common.add_command(experiment, "kill", _kill, "stop an experiment now: its trials are CANCELED")
    kill.add_argument("experiment_id", metavar="ID", type=int, help="experiment id")
    pause = _common.add_command(experiment, "pause", _pause,
                                "pause a running experiment (as Ctrl-C in its terminal); `continue` resumes it")
    pause.add_argument("experiment_id", metavar="ID", type=int, help="experiment id")
    activate = _common.add_command(experiment, "activate", _activate,
                                   "continue a paused experiment in the background (`continue` in its own process)")
    activate.add_argument("experiment_id", metavar="ID", type=int, help="experiment id")
    delete = _common.add_command(experiment, "delete", _delete,
                                 "delete an experiment that is not running: records, checkpoints, logs")
    delete.add_argument("experiment_id", metavar="ID", type=int, help="experiment id")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    describe = _common.add_command(group_of(commands, "trial"), "describe", _describe,
                                   "show one trial: state, hyperparameters, checkpoints, latest metrics, "
                                   "where its wall time went")
    describe.add_argument("trial_id", metavar="TRIAL_ID", type=int, help="trial id")
    describe.add_argument("--json", dest="fmt", action="store_const", const="json", default="table",
                          help="print the trial's record and its time parts as JSON")


def _kill(args: argparse.Namespace) -> int:
    from determined_trials.experiment import kill_experiment

    _control(kill_experiment, args)
    print(f"experiment {args.experiment_id} killed: its trials are CANCELED (their checkpoints are kept)")
    return 0


def _pause(args: argparse.Namespace) -> int:
    from determined_trials.experiment import pause_experiment

    _control(pause_experiment, args)
    print(f"experiment {args.experiment_id} is pausing: its trials checkpoint and stop")
    return 0


def _activate(args: argparse.Namespace) -> int:
    from determined_trials.experiment import CONTINUE_LOG, activate_experiment

    pid = _control(activate_experiment, args)
    print(f"experiment {args.experiment_id} continues in the background (pid {pid}; output in {CONTINUE_LOG} "
          "next to its model folder)")
    return 0


def _control(action: Callable[[LocalStore, int], _T], args: argparse.Namespace) -> _T:
    """Run one of ``experiment/_control``'s actions on the experiment; its ``ExperimentError`` is a CLI error."""
    from determined_trials.experiment import ExperimentError

    try:
        return action(_common.open_store(args), args.experiment_id)
    except ExperimentError as exc:
        raise _common.CliError(str(exc)) from None


def _delete(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    exp = store.experiment(args.experiment_id)
    from determined_trials.experiment import live_owner

    if live_owner(store, exp.id) is not None:
        raise _common.CliError(f"experiment {exp.id} is running; stop it first (`det-trials experiment kill "
                               f"{exp.id}`, or Ctrl-C in its terminal)")
    checkpoints = store.checkpoints(experiment_id=exp.id)
    if not args.yes and not _confirm(f"delete experiment {exp.id} ({exp.name}) with {len(checkpoints)} "
                                     "checkpoint(s)? [y/N] "):
        print("not deleted")
        return 1
    for record in checkpoints:
        checkpoint_storage_for(store, record.uuid).delete(record.uuid)  # type: ignore[attr-defined]
        store.mark_checkpoint_deleted(record.uuid)
    _mark_deleted_in_trackers(store, exp.id)
    for folder in (store.path / "experiments" / str(exp.id), store.path / "tensorboard" / f"experiment_{exp.id}"):
        shutil.rmtree(folder, ignore_errors=True)
    store.delete_experiment(exp.id)
    print(f"experiment {exp.id} deleted ({len(checkpoints)} checkpoint(s))")
    return 0


def _mark_deleted_in_trackers(store: LocalStore, experiment_id: int) -> None:
    """The trials' tracker runs outlive the experiment: their checkpoint tags say that the files are gone."""
    from determined_trials.config import load_config
    from determined_trials.core.trackers import mark_deleted_checkpoints

    config = load_config(store.experiment(experiment_id).config)
    mark_deleted_checkpoints(store, config, [trial.id for trial in store.trials(experiment_id)])


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise _common.CliError("not a terminal: pass --yes to delete without confirmation")
    return input(question).strip().lower() in ("y", "yes")


_TRACKER_NAMES = {"mlflow": "MLflow", "wandb": "W&B", "tensorboard": "TensorBoard"}


def _tracker_pairs(store: LocalStore, trial_id: int) -> list[tuple[str, str | None]]:
    """Each tracker's run of the trial, and the points it holds that a restart superseded with other values."""
    pairs: list[tuple[str, str | None]] = []
    for tracker, run in store.tracker_runs(trial_id).items():
        name = _TRACKER_NAMES.get(tracker, tracker)
        label = "TensorBoard logdir" if tracker == "tensorboard" else f"{name} run"  # its run is a folder
        pairs.append((label, run["run_id"] + (f" ({run['url']})" if run["url"] else "")))
        held: dict[str, list[int]] = run["progress"].get("held", {})
        if held:
            steps = sorted({step for each in held.values() for step in each})
            shown = ", ".join(map(str, steps[:10])) + (", ..." if len(steps) > 10 else "")
            pairs.append((f"{name} superseded", f"{name} holds {sum(map(len, held.values()))} superseded points "
                                                 f"(steps {shown}; the store's values are current)"))
    return pairs


def _describe(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    release_dead_owners(store)
    trial = store.trial(args.trial_id)
    spent = store.trial_time(trial.id, now=time.time())
    if _common.output_format(args) == "json":
        sys.stdout.write(json.dumps({**jsonable(trial), "time": spent}, indent=2, allow_nan=False) + "\n")
        return 0
    exp = store.experiment(trial.experiment_id)
    raw = exp.config.get("searcher")
    searcher: dict[str, Any] = raw if isinstance(raw, dict) else {}
    metric = searcher.get("metric") if searcher else None
    checkpoints = store.checkpoints(trial_id=trial.id)
    latest = checkpoints[-1] if checkpoints else None
    pairs = [
        ("experiment", f"{exp.id} ({exp.name})"),
        ("state", trial.state + (f" ({trial.reason})" if trial.reason else "")),
        ("status", trial.status if trial.state == RunState.ACTIVE else None),
        ("hparams", " ".join(flat_hparams(trial.hparams))),
        ("seed", str(trial.seed)),
        ("restarts", str(trial.restarts)),
        ("early exit", trial.early_exit_reason),
        ("started", local_time(trial.start_time)),
        ("ended", local_time(trial.end_time)),
        ("checkpoints", str(len(checkpoints))),
        ("latest checkpoint", f"{latest.uuid} (step {latest.steps_completed})" if latest else None),
        *_search.lineage_pairs(trial, store),
        *_tracker_pairs(store, trial.id),
    ]
    for group in ("training", "validation"):
        records = store.metrics(trial.id, group)
        if records:
            last = records[-1]
            shown = ", ".join(f"{k}={text(v)}" for k, v in last.metrics.items())
            pairs.append((f"last {group}", f"step {last.steps_completed}: {shown}"))
    if metric:
        best = [r.metrics.get(metric) for r in store.metrics(trial.id, "validation")]
        usable = [v for v in best if isinstance(v, (int, float)) and v == v]
        smaller = bool(searcher.get("smaller_is_better", True))
        if usable:
            pairs.append((f"best {metric}", text(min(usable) if smaller else max(usable))))
    shown_pairs = [(k, v) for k, v in pairs if v]
    width = max(len(k) for k, _ in shown_pairs)
    sys.stdout.write(f"Trial {trial.id}\n")
    sys.stdout.writelines(f"  {k + ':':<{width + 1}} {v}\n" for k, v in shown_pairs)
    write_time(sys.stdout, spent, "Time (seconds; where the trial's wall time went)")
    return 0
