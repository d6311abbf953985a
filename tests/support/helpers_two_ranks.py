"""Two worker processes with torchrun's variables on 127.0.0.1, for the tests that run a plan of scenarios
on 2 ranks (``test_pytorch_distributed.py``, ``test_fsdp.py``): each worker reads the plan, runs its
scenarios and writes ``<out>/<name>-rank<R>.json``; its output goes to ``<tmp>/rank<R>.log``."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.helpers_paths import SUPPORT

__all__ = ["Results", "launch", "log", "ranks"]

Results = dict[str, list[dict[str, Any]]]  # scenario name -> one result per rank


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def ranks(worker: Path, tmp: Path, scenarios: list[dict[str, Any]], world: int = 2,
          **env: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start ``world`` (2) ``worker`` processes on the plan of ``scenarios``; kill whatever is left on the way out."""
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"out": str(tmp), "scenarios": scenarios}))
    base = {
        **os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "DET_JOB_ID": uuid.uuid4().hex,
        "DET_RUN_DIR": str(tmp / "run"), "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]), **env,
    }
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(world):
            with open(tmp / f"rank{rank}.log", "wb") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, str(worker), str(plan)], env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    stdout=out, stderr=subprocess.STDOUT,
                ))
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        assert all(proc.poll() is not None for proc in procs), "a rank process was left behind"


def log(tmp: Path, rank: int) -> str:
    """What rank ``rank`` printed."""
    return (tmp / f"rank{rank}.log").read_text(errors="replace")


def launch(worker: Path, tmp: Path, scenarios: list[dict[str, Any]], timeout_s: float, world: int = 2) -> Results:
    """Run the scenarios on ``world`` (2) ranks; every one must exit 0 within ``timeout_s``."""
    with ranks(worker, tmp, scenarios, world) as procs:
        for rank, proc in enumerate(procs):
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {rank} did not finish in {timeout_s:g} s:\n{log(tmp, rank)[-4000:]}")
            assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{log(tmp, rank)[-4000:]}"
    return {s["name"]: [json.loads((tmp / f"{s['name']}-rank{r}.json").read_text()) for r in range(world)]
            for s in scenarios}
