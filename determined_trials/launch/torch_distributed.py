"""``python -m determined_trials.launch.torch_distributed [OPTIONS] [TORCH_OVERRIDES... --]
(--trial FILEPATH:ClassName | SCRIPT [ARGS...])``: run a trial or a script on every slot with torchrun.

OPTIONS (ours, first): ``--config PATH`` (the experiment config; else ``$DET_EXPERIMENT_CONFIG``, else
the cluster info), ``--context-dir DIR``, ``--latest-checkpoint UUID|latest``, ``--fail-grace SECONDS``.
TORCH_OVERRIDES go to ``torch.distributed.run`` after our defaults, so they win; end them with ``--``.
One process per slot (``resources.slots_per_trial``, split over ``$DET_NNODES`` nodes), each wrapped in
``wrap_rank``. A ``--trial`` on one slot runs without torchrun. Exit status: 0 when every worker
succeeded, the failing rank's exit code when one failed, 75 after a preemption (resumable; also for a
SIGTERM or Ctrl-C that comes before the workers start), 2 for a usage, config or spec problem.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from determined_trials.launch import _args
from determined_trials.launch._launch_dir import LAUNCH_DIR_ENV, PREEMPTED_EXIT_CODE
from determined_trials.launch._procs import StopRequested, free_port, record_stop_signals
from determined_trials.launch._supervise import Supervisor
from determined_trials.launch._trial_spec import TrialSpecError, family_launcher, parse_trial_spec
from determined_trials.launch.harness import CONFIG_ENV, LATEST_CHECKPOINT_ENV, HarnessError, resolve_latest_checkpoint

__all__ = ["build_command", "main", "run_launcher"]

NAME = "torch_distributed"
DEFAULT_C10D_PORT = 29400
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def _worker_command(args: _args.LaunchArgs) -> list[str]:
    if args.trial is not None:
        cmd = [sys.executable, "-m", "determined_trials.launch.harness", "--trial", args.trial]
        return cmd + (["--context-dir", args.context_dir] if args.context_dir else [])
    if args.script[0].endswith(".py"):
        return [sys.executable, *args.script]
    return list(args.script)


def _node_layout(config: Any) -> tuple[int, int, int]:
    """(nnodes, node_rank, processes per node) from the environment and the config's slots."""
    nnodes = _env_int("DET_NNODES", 1)
    node_rank = _env_int("DET_NODE_RANK", 0)
    slots = config.resources.slots_per_trial if config is not None else 1
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise _args.LaunchError(f"DET_NODE_RANK={node_rank} is not a node of DET_NNODES={nnodes}")
    if slots % nnodes:
        raise _args.LaunchError(f"resources.slots_per_trial={slots} cannot be split evenly over DET_NNODES={nnodes} "
                                f"nodes; use a multiple of {nnodes}")
    return nnodes, node_rank, slots // nnodes


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise _args.LaunchError(f"environment variable {name}={raw!r} is not an integer") from None


def build_command(args: _args.LaunchArgs, config: Any) -> tuple[list[str], dict[str, str]]:
    """The command to supervise and the environment additions (launch folder excluded)."""
    nnodes, node_rank, nproc = _node_layout(config)
    wrapped = [sys.executable, "-m", "determined_trials.launch.wrap_rank"]
    env: dict[str, str] = {}
    if args.trial is not None and nnodes == 1 and nproc == 1 and not args.overrides:
        return [*wrapped, "0", "--", *_worker_command(args)], env  # one process: no torchrun needed
    if nnodes == 1:
        # torchrun --standalone binds its rendezvous store to a free port and keeps it: no port is
        # picked, released and taken later, so two jobs on one host can never meet in one store.
        chief_ip, rendezvous = "127.0.0.1", ["--standalone"]
        env.update(DET_JOB_ID=uuid.uuid4().hex, DET_CORE_PORT=str(free_port()))
    else:  # every node runs this launcher: shared addresses come from the environment
        chief_ip = os.environ.get("DET_CHIEF_IP", "")
        if not chief_ip:
            raise _args.LaunchError(f"DET_NNODES={nnodes}: set DET_CHIEF_IP to the address of node 0")
        master_port = _env_int("DET_MASTER_PORT", DEFAULT_C10D_PORT)
        rendezvous = ["--master_addr", chief_ip, "--master_port", str(master_port)]
    env.update(DET_CHIEF_IP=chief_ip, USE_TORCH_DISTRIBUTED="1")
    if "OMP_NUM_THREADS" not in os.environ:  # torchrun's own default for several ranks, without its banner
        env["OMP_NUM_THREADS"] = "1"
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node_rank", str(node_rank),
        "--nproc_per_node", str(nproc), "--max_restarts", "0", *rendezvous, "--monitor_interval", "0.1",
        *args.overrides, "--no-python",
    ]
    return [*torchrun, *wrapped, "RANK", "--", *_worker_command(args)], env


def _load_config(args: _args.LaunchArgs) -> Any:
    from determined_trials._info import get_cluster_info
    from determined_trials.config import load_config
    from determined_trials.errors import ConfigError

    source: Any = args.config or os.environ.get(CONFIG_ENV)
    if not source:
        info = get_cluster_info()
        if info is None:
            if args.trial is not None:
                raise _args.LaunchError(f"--trial needs an experiment config: pass --config PATH (before any "
                                        f"torchrun options) or set ${CONFIG_ENV}")
            return None
        source = info.trial.config
    try:
        return load_config(source)
    except (ConfigError, ValueError) as exc:
        raise _args.LaunchError(str(exc)) from None


def _environment(args: _args.LaunchArgs, additions: dict[str, str], folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_ENV}
    env.update(additions)
    env[LAUNCH_DIR_ENV] = str(folder)
    env.setdefault("PYTHONUNBUFFERED", "1")  # workers' lines reach wrap_rank as they are written
    env = {k: v for k, v in env.items() if v or k not in additions}  # an empty addition removes the variable
    if args.config:
        env[CONFIG_ENV] = str(Path(args.config).resolve())
    if args.latest_checkpoint:
        latest = resolve_latest_checkpoint(args.latest_checkpoint)
        if latest:
            env[LATEST_CHECKPOINT_ENV] = latest
    return env


def main(argv: Sequence[str] | None = None) -> int:
    """Run the launcher command line (default: ``sys.argv[1:]``); returns the exit status."""
    return run_launcher(sys.argv[1:] if argv is None else argv, NAME, "torchrun", build_command, __doc__ or "")


def run_launcher(argv: Sequence[str], name: str, engine: str,
                 build: Callable[[_args.LaunchArgs, Any], tuple[list[str], dict[str, str]]], usage: str) -> int:
    """Parse ``argv``, build the command with ``build(args, config)`` and supervise it (every launcher's
    ``main``); a ``--trial`` of another family on several slots is handed to that family's launcher.
    SIGTERM/SIGINT are handled from the start: one that comes before the workers start ends the
    preparation (and its probe child) with the preempted status, 75, as nothing needs a checkpoint."""
    with record_stop_signals() as stop:
        try:
            args = _args.parse(argv, engine=engine)
            if args.help:
                print(usage)
                return 0
            if args.trial is not None:
                parse_trial_spec(args.trial, args.context_dir or ".")
            config = _load_config(args)
            other = family_launcher(args.trial, args.context_dir or ".", name, stop) if _slots(config) > 1 else None
            if stop:
                raise StopRequested(signal.Signals(stop[0]).name)
            if other is not None:
                return int(importlib.import_module(other).main(list(argv)))
            cmd, additions = build(args, config)
            folder = Path(tempfile.mkdtemp(prefix="det-launch-"))
            try:
                env = _environment(args, additions, folder)
                supervisor = Supervisor(cmd, env, folder, name=name, wait_ready=args.trial is not None,
                                        fail_grace=args.fail_grace, signals=stop)
                return supervisor.run()
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        except StopRequested as exc:
            print(f"{name}: received {exc} before starting the workers: nothing to checkpoint; exiting as "
                  f"preempted, resumable (exit {PREEMPTED_EXIT_CODE})", file=sys.stderr, flush=True)
            return PREEMPTED_EXIT_CODE
        except (_args.LaunchError, TrialSpecError, HarnessError) as exc:
            print(f"{name}: error: {exc}", file=sys.stderr)
            return 2


def _slots(config: Any) -> int:
    return int(config.resources.slots_per_trial) if config is not None else 1


if __name__ == "__main__":
    sys.exit(main())
