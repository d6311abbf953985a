"""``python -m determined_trials.launch.tensorflow [OPTIONS] [--] (--trial FILEPATH:ClassName | SCRIPT
[ARGS...])``: one process per slot on this machine, each with ``TF_CONFIG`` naming every worker on free
127.0.0.1 ports, for ``tf.distribute.MultiWorkerMirroredStrategy`` (``det.keras.init`` makes one).

OPTIONS as for ``torch_distributed``: ``--config PATH``, ``--context-dir DIR``, ``--latest-checkpoint
UUID|latest``, ``--fail-grace SECONDS``. Slots: ``resources.slots_per_trial``, on this machine, or split
evenly over ``$DET_NNODES`` machines, each running this launcher with its ``DET_NODE_RANK``, the same
``DET_CHIEF_IP``, ``DET_CORE_PORT``, ``DET_JOB_ID`` and ``DET_TF_WORKERS`` (every worker's host:port,
in rank order; what a Ray trial over nodes is given). Every worker runs under ``wrap_rank``. Exit status:
0 when every worker succeeded, the failing rank's exit code when one failed (the others are stopped
within the grace period), 75 after a preemption, 2 for a usage, config or spec problem.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from determined_trials.launch import _args
from determined_trials.launch._procs import free_port
from determined_trials.launch._spawn import TF_WORKERS_ENV
from determined_trials.launch.torch_distributed import _node_layout, _worker_command, run_launcher

__all__ = ["build_command", "main"]

NAME = "tensorflow"


def build_command(args: _args.LaunchArgs, config: Any) -> tuple[list[str], dict[str, str]]:
    """The command to supervise and the environment additions (launch folder excluded)."""
    if args.overrides:
        raise _args.LaunchError(f"the tensorflow launcher takes no engine options, got {' '.join(args.overrides)}")
    nnodes, _, per_node = _node_layout(config)
    slots = config.resources.slots_per_trial if config is not None else 1
    wrapped = [sys.executable, "-m", "determined_trials.launch.wrap_rank"]
    env = {"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"), "TF_CONFIG": ""}
    if nnodes > 1:  # one node of several: every worker's address, the chief and the job come from outside
        given = [w for w in os.environ.get(TF_WORKERS_ENV, "").split(",") if w]
        if len(given) != slots or not os.environ.get("DET_CHIEF_IP"):
            raise _args.LaunchError(f"DET_NNODES={nnodes}: set DET_CHIEF_IP to node 0's address and {TF_WORKERS_ENV} "
                                    f"to the {slots} workers' host:port, in rank order (got {len(given)})")
        spawn = [sys.executable, "-m", "determined_trials.launch._spawn", str(per_node), "--"]
        return [*spawn, *wrapped, "RANK", "--", *_worker_command(args)], env
    if slots == 1:
        return [*wrapped, "0", "--", *_worker_command(args)], env
    workers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(slots))
    env.update({TF_WORKERS_ENV: workers, "DET_CHIEF_IP": "127.0.0.1", "DET_JOB_ID": uuid.uuid4().hex,
                "DET_CORE_PORT": str(free_port())})
    spawn = [sys.executable, "-m", "determined_trials.launch._spawn", str(slots), "--"]
    return [*spawn, *wrapped, "RANK", "--", *_worker_command(args)], env


def main(argv: Sequence[str] | None = None) -> int:
    """Run the launcher command line (default: ``sys.argv[1:]``); returns the exit status."""
    return run_launcher(sys.argv[1:] if argv is None else argv, NAME, "tensorflow", build_command, __doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
