"""SIGTERM reaches should_preempt() on every rank, at the same call (WorkersAskChief)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support.helpers_paths import SUPPORT

import determined_trials as det

WORKER = SUPPORT / "worker_preempt.py"


def _start_ranks(size: int, run_dir: Path) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "DET_JOB_ID": uuid.uuid4().hex}
    return [
        subprocess.Popen([sys.executable, str(WORKER), str(rank), str(size), str(run_dir)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(size)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("signalled_rank, sig", [(0, signal.SIGTERM), (1, signal.SIGTERM), (1, signal.SIGUSR1)])
def test_a_signal_to_any_rank_stops_all_ranks_at_the_same_call(
    tmp_path: Path, signalled_rank: int, sig: signal.Signals
) -> None:
    procs = _start_ranks(2, tmp_path)
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        procs[signalled_rank].send_signal(sig)
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
    assert results[0]["calls"] == results[1]["calls"]
    assert results[0]["trial"] == results[1]["trial"]
    trial = det.core.LocalStore(tmp_path).trial(results[0]["trial"])
    assert trial.state == "PAUSED"
