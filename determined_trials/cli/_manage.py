"""``det-trials experiment kill|delete`` and ``trial describe``: the management commands Determined
users type (added to the existing command groups)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
from typing import Any

import psutil

from determined_trials._format import flat_hparams, local_time, text
from determined_trials.cli import _common
from determined_trials.cli._run import checkpoint_storage_for, group_of
from determined_trials.core.store._local import LocalStore
from determined_trials.core.store._owner import owner_alive, release_dead_owners

__all__ = ["register"]

_KILL_WAIT_S = 120.0
_UNFINISHED = ("ACTIVE", "PAUSED")


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``experiment kill|delete`` and ``trial describe``."""
    experiment = group_of(commands, "experiment")
    kill = _common.add_command(experiment, "kill", _kill, "stop an experiment now: its trials are CANCELED")
    kill.add_argument("experiment_id", metavar="ID", type=int, help="experiment id")
    delete = _common.add_command(experiment, "delete", _delete,
                                 "delete an experiment that is not running: records, checkpoints, logs")
    delete.add_argument("experiment_id", metavar="ID", type=int, help="experiment id")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    describe = _common.add_command(group_of(commands, "trial"), "describe", _describe,
                                   "show one trial: state, hyperparameters, checkpoints, latest metrics")
    describe.add_argument("trial_id", metavar="TRIAL_ID", type=int, help="trial id")


def _live_owner(store: LocalStore, experiment_id: int) -> int | None:
    release_dead_owners(store)
    owner = store.experiment_owner(experiment_id)
    if store.experiment(experiment_id).state == "ACTIVE" and owner is not None and owner_alive(*owner):
        return owner[0]
    return None


def _kill(args: argparse.Namespace) -> int:
    from determined_trials.experiment._runner import KILLED_REASON

    store = _common.open_store(args)
    exp = store.experiment(args.experiment_id)
    if exp.state not in _UNFINISHED:
        raise _common.CliError(f"experiment {exp.id} is {exp.state} already; nothing to kill")
    pid = _live_owner(store, exp.id)
    # Marked first: a runner that sees CANCELED on the signal stops its trials and ends CANCELED, not PAUSED.
    store.set_experiment_state(exp.id, "CANCELED", KILLED_REASON)
    if pid is not None:
        _stop_runner(exp.id, pid)
    for trial in store.trials(exp.id):
        if trial.state in _UNFINISHED:
            store.set_trial_state(trial.id, "CANCELED", "experiment killed")
    store.set_experiment_state(exp.id, "CANCELED", KILLED_REASON)
    print(f"experiment {exp.id} killed: its trials are CANCELED (their checkpoints are kept)")
    return 0


def _stop_runner(experiment_id: int, pid: int) -> None:
    """One SIGTERM, then wait until the runner is gone: seeing its experiment CANCELED, it kills its
    trials at once. Not again: a second signal could reach it after it restored the default handler,
    killing it before it reports."""
    try:
        runner = psutil.Process(pid)
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=_KILL_WAIT_S)
        return
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        pass
    raise _common.CliError(f"experiment {experiment_id}'s process {pid} did not stop within {_KILL_WAIT_S:.0f} s; "
                           f"end it with `kill -9 {pid}`")


def _delete(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    exp = store.experiment(args.experiment_id)
    if _live_owner(store, exp.id) is not None:
        raise _common.CliError(f"experiment {exp.id} is running; stop it first (`det-trials experiment kill "
                               f"{exp.id}`, or Ctrl-C in its terminal)")
    checkpoints = store.checkpoints(experiment_id=exp.id)
    if not args.yes and not _confirm(f"delete experiment {exp.id} ({exp.name}) with {len(checkpoints)} "
                                     "checkpoint(s)? [y/N] "):
        print("not deleted")
        return 1
    for record in checkpoints:
        checkpoint_storage_for(store, record.uuid).delete(record.uuid)  # type: ignore[attr-defined]
    for folder in (store.path / "experiments" / str(exp.id), store.path / "tensorboard" / f"experiment_{exp.id}"):
        shutil.rmtree(folder, ignore_errors=True)
    store.delete_experiment(exp.id)
    print(f"experiment {exp.id} deleted ({len(checkpoints)} checkpoint(s))")
    return 0


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise _common.CliError("not a terminal: pass --yes to delete without confirmation")
    return input(question).strip().lower() in ("y", "yes")


def _describe(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    release_dead_owners(store)
    trial = store.trial(args.trial_id)
    exp = store.experiment(trial.experiment_id)
    raw = exp.config.get("searcher")
    searcher: dict[str, Any] = raw if isinstance(raw, dict) else {}
    metric = searcher.get("metric") if searcher else None
    checkpoints = store.checkpoints(trial_id=trial.id)
    latest = checkpoints[-1] if checkpoints else None
    pairs = [
        ("experiment", f"{exp.id} ({exp.name})"),
        ("state", trial.state + (f" ({trial.reason})" if trial.reason else "")),
        ("status", trial.status if trial.state == "ACTIVE" else None),
        ("hparams", " ".join(flat_hparams(trial.hparams))),
        ("seed", str(trial.seed)),
        ("restarts", str(trial.restarts)),
        ("early exit", trial.early_exit_reason),
        ("started", local_time(trial.start_time)),
        ("ended", local_time(trial.end_time)),
        ("checkpoints", str(len(checkpoints))),
        ("latest checkpoint", f"{latest.uuid} (step {latest.steps_completed})" if latest else None),
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
    return 0
