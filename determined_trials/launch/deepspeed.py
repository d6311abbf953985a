"""``python -m determined_trials.launch.deepspeed [OPTIONS] [DEEPSPEED_ARGS... --] (--trial FILEPATH:ClassName |
SCRIPT [ARGS...])``: run a trial or a script on every slot with DeepSpeed's own launcher.

OPTIONS are those of ``torch_distributed`` (``--config``, ``--context-dir``, ``--latest-checkpoint``,
``--fail-grace``). DEEPSPEED_ARGS go to DeepSpeed's runner after our defaults (``--num_gpus`` =
``resources.slots_per_trial``, a free ``--master_port`` on 127.0.0.1, ``--log_level warning`` unless
``$DET_DEEPSPEED_LOG_LEVEL`` names another, ``--no_python --no_local_rank``), so they win; give ``--hostfile
FILE`` (and ``--master_addr``) for several machines, which DeepSpeed reaches over ssh (only the local ranks
are supervised then); without a hostfile, ``$DET_NNODES`` > 1 (as for ``torch_distributed``: this node's
``DET_NODE_RANK``, ``DET_CHIEF_IP``, ``DET_MASTER_PORT``, ``DET_CORE_PORT``, ``DET_JOB_ID``) runs this
node's ranks with torchrun's multi-node rendezvous instead, which DeepSpeed joins. Every rank runs under
``wrap_rank``; a ``--trial`` on one slot runs without DeepSpeed's launcher. Exit status as for
``torch_distributed``: 0, the failing rank's code, 75 after a preemption, 2 for a usage, config or spec problem.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from determined_trials.launch import _args, torch_distributed
from determined_trials.launch._procs import free_port
from determined_trials.launch.torch_distributed import _worker_command, run_launcher

__all__ = ["build_command", "main"]

NAME = "deepspeed"
_HOSTFILE_FLAGS = ("-H", "--hostfile")
LOG_LEVEL_ENV = "DET_DEEPSPEED_LOG_LEVEL"  # as in determined_trials.deepspeed._logs (not imported: no torch here)
_RUNNER_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _runner_log_level() -> str:
    """DeepSpeed's launcher logs every step at INFO by default; ours asks for WARNING unless told."""
    level = os.environ.get(LOG_LEVEL_ENV, "").strip().lower() or "warning"
    if level not in _RUNNER_LOG_LEVELS:
        raise _args.LaunchError(f"${LOG_LEVEL_ENV}={level!r} is not a log level; use one of "
                                f"{', '.join(_RUNNER_LOG_LEVELS)}")
    return level


def _slots(config: Any) -> int:
    return int(config.resources.slots_per_trial) if config is not None else 1


def _nnodes() -> int:
    raw = os.environ.get("DET_NNODES", "").strip() or "1"
    try:
        return int(raw)
    except ValueError:
        raise _args.LaunchError(f"environment variable DET_NNODES={raw!r} is not an integer") from None


def build_command(args: _args.LaunchArgs, config: Any) -> tuple[list[str], dict[str, str]]:
    """The command to supervise and the environment additions (launch folder excluded)."""
    wrapped = [sys.executable, "-m", "determined_trials.launch.wrap_rank"]
    slots = _slots(config)
    env: dict[str, str] = {"USE_DEEPSPEED": "1"}
    if args.trial is not None and slots == 1 and not args.overrides:
        return [*wrapped, "0", "--", *_worker_command(args)], env  # one process: no launcher needed
    multi_node = any(a.partition("=")[0] in _HOSTFILE_FLAGS for a in args.overrides)
    if not multi_node and _nnodes() > 1:
        if args.overrides:
            raise _args.LaunchError(f"DET_NNODES={_nnodes()} runs this node's ranks with torchrun, not DeepSpeed's "
                                    f"runner: its options {' '.join(args.overrides)} do not apply")
        # one node of several (DET_NNODES, e.g. a Ray trial over nodes): torchrun's multi-node rendezvous
        # starts this node's ranks; DeepSpeed reads the ranks and the master from torchrun's environment
        cmd, torch_env = torch_distributed.build_command(args, config)
        return cmd, {**torch_env, **env}
    runner = [sys.executable, "-m", "deepspeed.launcher.runner"]
    if not multi_node:
        env.update(DET_JOB_ID=uuid.uuid4().hex, DET_CORE_PORT=str(free_port()), DET_CHIEF_IP="127.0.0.1")
        runner += ["--num_gpus", str(slots), "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    runner += ["--log_level", _runner_log_level(), "--no_python", "--no_local_rank", *args.overrides]
    return [*runner, *wrapped, "RANK", "--", *_worker_command(args)], env


def main(argv: Sequence[str] | None = None) -> int:
    """Run the launcher command line (default: ``sys.argv[1:]``); returns the exit status."""
    return run_launcher(sys.argv[1:] if argv is None else argv, name=NAME, engine="deepspeed", build=build_command,
                        usage=__doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
