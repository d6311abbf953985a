"""``python -m determined_trials.launch._spawn N -- CMD...``: start CMD once per rank 0..N-1 on this machine
(the part torchrun plays for torch), each with RANK/WORLD_SIZE/LOCAL_RANK... (this node's ranks when
``$DET_NNODES`` > 1) and, when ``$DET_TF_WORKERS`` lists the workers' addresses, its own ``TF_CONFIG``.
Exits with the first failing rank's status (0 when all succeed); the children die with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from determined_trials.launch._procs import die_with_parent, exit_code

__all__ = ["TF_WORKERS_ENV", "main", "rank_environment"]

TF_WORKERS_ENV = "DET_TF_WORKERS"


def rank_environment(local_rank: int, size: int, base: dict[str, str]) -> dict[str, str]:
    """``base`` plus the layout variables of the ``local_rank``-th of this machine's ``size`` processes and
    its TF_CONFIG. With ``DET_NNODES``/``DET_NODE_RANK`` in ``base`` this machine is one node of several,
    each running ``size`` processes: global rank = node rank x size + local rank."""
    env = dict(base)
    nnodes = int(env.get("DET_NNODES", "") or 1)
    node_rank = int(env.get("DET_NODE_RANK", "") or 0) if nnodes > 1 else 0
    rank = node_rank * size + local_rank
    env.update(RANK=str(rank), WORLD_SIZE=str(size * nnodes), LOCAL_RANK=str(local_rank),
               LOCAL_WORLD_SIZE=str(size), GROUP_RANK=str(node_rank), GROUP_WORLD_SIZE=str(nnodes))
    workers = [w for w in env.get(TF_WORKERS_ENV, "").split(",") if w]
    if workers:
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
    return env


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the job's exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or not args[0].isdigit() or args[1] != "--":
        print("usage: python -m determined_trials.launch._spawn N -- CMD [ARGS...]", file=sys.stderr)
        return 2
    size, cmd = int(args[0]), args[2:]
    children = [
        subprocess.Popen(cmd, env=rank_environment(rank, size, dict(os.environ)),
                         preexec_fn=die_with_parent(signal.SIGKILL))
        for rank in range(size)
    ]
    status = 0
    pending = {child.pid: child for child in children}
    while pending:
        pid, raw = os.wait()
        if pending.pop(pid, None) is not None:
            code = exit_code(os.waitstatus_to_exitcode(raw))
            status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main())
