"""``det-trials experiment create|continue``, ``trial fork``, ``trial logs`` and ``checkpoint export
[--consolidate]``: the commands that run local experiments and get their output out (added to the existing
command groups)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from determined_trials.cli import _common
from determined_trials.core.store import CheckpointState, LocalStore, RunState

__all__ = ["checkpoint_storage_for", "group_of", "register", "trial_log_path"]

_EXIT: dict[str, int] = {RunState.COMPLETED: 0, RunState.ERROR: 1, RunState.CANCELED: 3, RunState.PAUSED: 75}
_FOLLOW_POLL_S = 0.2


def group_of(commands: argparse._SubParsersAction, name: str) -> argparse._SubParsersAction:
    """The subcommands of an already registered group (``experiment``, ``trial``, ``checkpoint``)."""
    parser = commands.choices[name]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError(f"command group {name!r} has no subcommands; register it before this module")


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``experiment create|continue``, ``trial logs`` and ``checkpoint export``."""
    experiment = group_of(commands, "experiment")
    create = _common.add_command(experiment, "create", _create, "create an experiment and run its trials")
    create.add_argument("config", metavar="CONFIG", help="experiment configuration (YAML)")
    create.add_argument("context_dir", metavar="CONTEXT_DIR", help="folder with the training code (snapshotted)")
    create.add_argument("--max-context-mb", type=float, default=None, metavar="MB",
                        help="the largest context directory accepted (default: 95)")
    resume = _common.add_command(experiment, "continue", _continue, "resume a paused experiment")
    resume.add_argument("experiment_id", metavar="ID", type=int, help="experiment id")
    fork = _common.add_command(group_of(commands, "trial"), "fork", _fork,
                               "a new experiment whose one trial continues a checkpoint exactly")
    fork.add_argument("trial_id", metavar="TRIAL_ID", type=int, nargs="?", help="fork this trial's latest checkpoint")
    fork.add_argument("--checkpoint", metavar="UUID|PATH", help="fork this checkpoint (instead of TRIAL_ID): a uuid, "
                      "or the folder of another run folder's checkpoint (e.g. OTHER/checkpoints/UUID)")
    fork.add_argument("--from-run-dir", metavar="OTHER", default=None,
                      help="the run folder whose checkpoint --checkpoint UUID is (copied into this one)")
    fork.add_argument("--config", dest="config_file", metavar="OVERRIDES.YAML", default=None,
                      help="change the config by a YAML file of the settings to change (before --set)")
    fork.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                      help="change the config (value as YAML), e.g. --set hyperparameters.lr=0.01 (repeatable)")
    fork.add_argument("--max-length", type=int, default=None, metavar="N",
                      help="train to N (the parent's searcher unit), counted from the start of the lineage")
    for parser in (create, resume, fork):
        parser.add_argument("--max-parallel", type=int, default=None, metavar="N",
                            help="run up to N trials at once (default: 1, one after another)")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")
        parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                            help="run the trials on a Ray cluster: auto, ray://host:port, or none for a Ray "
                                 "started on this machine (docs/ray.md)")
    logs = _common.add_command(group_of(commands, "trial"), "logs", _logs, "print a trial's output")
    logs.add_argument("trial_id", metavar="TRIAL_ID", type=int, help="trial id")
    logs.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N lines")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines while the trial runs")
    export = _common.add_command(group_of(commands, "checkpoint"), "export", _export,
                                 "copy a checkpoint out of storage into a folder")
    export.add_argument("uuid", metavar="UUID", help="checkpoint uuid")
    export.add_argument("dest", metavar="DIR", nargs="?", help="destination folder (created; must be empty)")
    export.add_argument("--consolidate", metavar="TAG", nargs="?", const="model0", default=None,
                        help="DeepSpeedTrial checkpoints: also write TAG's (default model0) ZeRO shards merged into "
                             "one plain state_dict, DIR/<TAG>_consolidated.pt; FSDP2 (DCP) checkpoints of a "
                             "PyTorchTrial: the shards of wrapped model <i> (TAG model<i>, default model0). "
                             "`export --consolidate UUID DIR` works too")


def _print_result(result: object, args: argparse.Namespace) -> int:
    from determined_trials.experiment import ExperimentResult, trials_table

    assert isinstance(result, ExperimentResult)
    out = sys.stdout
    out.write(f"\nExperiment {result.experiment_id}: {result.state}\n")
    if result.reason:
        out.write(f"  {result.reason}\n")
    out.write(trials_table(result.trials, result.metric, fit=_common.table_width(args)))
    return _EXIT.get(result.state, 1)


def _create(args: argparse.Namespace) -> int:
    from determined_trials import experiment
    from determined_trials.errors import ConfigError

    limit = experiment.DEFAULT_MAX_CONTEXT_BYTES
    if args.max_context_mb is not None:
        limit = int(args.max_context_mb * 1024 * 1024)
    try:
        result = experiment.create_experiment(
            args.config, args.context_dir, run_dir=_common.run_dir(args), max_parallel=args.max_parallel,
            max_context_bytes=limit, display=experiment.Display(progress=False if args.no_progress else None),
            ray=args.ray,
        )
    except (ConfigError, experiment.ContextTooLargeError, experiment.ExperimentError, FileNotFoundError) as exc:
        raise _common.CliError(str(exc)) from None
    return _print_result(result, args)


def _fork(args: argparse.Namespace) -> int:
    from determined_trials import experiment
    from determined_trials.errors import ConfigError

    if args.from_run_dir is None and os.sep not in (args.checkpoint or ""):  # another run folder's: may be a new one
        _common.open_store(args)  # a clear error for a missing run dir
    try:
        result = experiment.fork_trial(
            args.trial_id, checkpoint=args.checkpoint, overrides=tuple(args.overrides), max_length=args.max_length,
            run_dir=_common.run_dir(args), display=experiment.Display(progress=False if args.no_progress else None),
            ray=args.ray, config_file=args.config_file, from_run_dir=args.from_run_dir,
        )
    except (ConfigError, experiment.ExperimentError, FileNotFoundError) as exc:
        raise _common.CliError(str(exc)) from None
    return _print_result(result, args)


def _continue(args: argparse.Namespace) -> int:
    from determined_trials import experiment

    _common.open_store(args)  # a clear error for a missing run dir
    try:
        result = experiment.continue_experiment(
            args.experiment_id, run_dir=_common.run_dir(args), max_parallel=args.max_parallel,
            display=experiment.Display(progress=False if args.no_progress else None), ray=args.ray,
        )
    except experiment.ExperimentError as exc:
        raise _common.CliError(str(exc)) from None
    return _print_result(result, args)


def trial_log_path(run_dir: Path, experiment_id: int, trial_id: int) -> Path:
    """Where the experiment runner keeps a trial's output."""
    return run_dir / "experiments" / str(experiment_id) / f"trial_{trial_id}.log"


def _logs(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    trial = store.trial(args.trial_id)
    path = trial_log_path(store.path, trial.experiment_id, trial.id)
    if not path.is_file():
        raise _common.CliError(f"trial {trial.id} has no log at {path}: only trials run by "
                               "`det-trials experiment create` keep one")
    with open(path, "rb") as log:
        data = log.read()
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    if args.tail is not None:
        lines = lines[-args.tail:] if args.tail > 0 else []
    sys.stdout.writelines(lines)
    if args.follow:
        _follow(store, trial.id, path, len(data))
    return 0


def _follow(store: LocalStore, trial_id: int, path: Path, offset: int) -> None:
    """Print what is appended to the log from ``offset`` on, until the trial stops running (or its
    experiment's process is gone)."""
    from determined_trials.core.store import release_dead_owners

    with open(path, "rb") as log:
        log.seek(offset)
        while True:
            chunk = log.read()
            if chunk:
                sys.stdout.write(chunk.decode("utf-8", errors="replace"))
                sys.stdout.flush()
                continue
            release_dead_owners(store)
            if store.trial(trial_id).state != RunState.ACTIVE:
                sys.stdout.write(log.read().decode("utf-8", errors="replace"))
                return
            time.sleep(_FOLLOW_POLL_S)


def checkpoint_storage_for(store: object, uuid: str) -> object:
    """The storage backend that holds checkpoint ``uuid`` (from its experiment's config)."""
    from determined_trials.core.storage import storage_from_spec
    from determined_trials.core.store import LocalStore

    assert isinstance(store, LocalStore)
    record = store.checkpoint(uuid)
    spec = None
    if record.experiment_id is not None:
        spec = store.experiment(record.experiment_id).config.get("checkpoint_storage")
    return storage_from_spec(spec, default_dir=store.path / "checkpoints")


def _export(args: argparse.Namespace) -> int:
    from determined_trials.core.storage import StorageManager

    if args.dest is None:  # `export --consolidate UUID DIR`: the optional TAG took the uuid
        if args.consolidate is None:
            raise _common.CliError("checkpoint export takes UUID DIR")
        args.consolidate, args.uuid, args.dest = "model0", args.consolidate, args.uuid

    store = _common.open_store(args)
    record = store.checkpoint(args.uuid)
    if record.state == CheckpointState.DELETED:
        raise _common.CliError(f"checkpoint {args.uuid} was deleted (checkpoint GC); `det-trials checkpoint "
                               "list` shows the ones kept")
    dest = Path(args.dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise _common.CliError(f"{dest} exists and is not an empty folder; give a new or empty folder")
    storage = checkpoint_storage_for(store, args.uuid)
    assert isinstance(storage, StorageManager)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        storage.download(args.uuid, dest)
    except Exception as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise _common.CliError(f"could not export checkpoint {args.uuid} from {storage}: {exc}") from None
    print(f"checkpoint {args.uuid} ({record.steps_completed} steps) exported to {dest}")
    if args.consolidate:
        kind = "FSDP2 model" if _is_dcp(dest) else "DeepSpeed engine"
        print(f"one state_dict of its {kind} {args.consolidate!r}: {_consolidate(dest, args.consolidate)}")
    return 0


def _is_dcp(folder: Path) -> bool:
    from determined_trials.pytorch.parallel import is_dcp_checkpoint

    return is_dcp_checkpoint(folder)


def _consolidate_dcp(folder: Path, tag: str) -> dict[str, Any]:
    """Wrapped model ``model<i>`` of an FSDP2 checkpoint's DCP shards as one plain state_dict."""
    from determined_trials.pytorch.checkpoint import read_dcp_models

    index = tag.removeprefix("model")
    models = read_dcp_models(folder)
    if not index.isdigit() or int(index) >= len(models):
        raise ValueError(f"TAG {tag!r} names no model of this FSDP2 checkpoint: it holds "
                         f"{', '.join(f'model{i}' for i in range(len(models)))}")
    return models[int(index)]


def _consolidate(folder: Path, tag: str) -> Path:
    """Write engine ``tag``'s ZeRO shards of a DeepSpeedTrial checkpoint in ``folder`` as one state_dict."""
    import torch

    from determined_trials.deepspeed import consolidate_checkpoint

    try:
        state = _consolidate_dcp(folder, tag) if _is_dcp(folder) else consolidate_checkpoint(folder, tag=tag)
    except (FileNotFoundError, ValueError) as exc:
        raise _common.CliError(f"--consolidate: {exc}") from None
    out = folder / f"{tag}_consolidated.pt"
    torch.save(state, out)
    return out
