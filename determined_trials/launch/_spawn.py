"""``python -m determined_trials.launch._spawn N -- CMD...``: start CMD once per rank 0..N-1 on this machine
(the part torchrun plays for torch), each with RANK/WORLD_SIZE/LOCAL_RANK... and, when
``$DET_TF_WORKERS`` lists the workers' addresses, its own ``TF_CONFIG``. Exits with the first failing
rank's status (0 when all succeed); the children die with it."""

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


def rank_environment(rank: int, size: int, base: dict[str, str]) -> dict[str, str]:
    """``base`` plus the layout variables of ``rank`` (one machine) and its TF_CONFIG."""
    env = dict(base)
    env.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size),
               GROUP_RANK="0", GROUP_WORLD_SIZE="1")
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
