"""Smoke test of ``benchmarks/ray_executor.py --quick``: it runs end to end and prints its three ratio lines
(no timing checks)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from support.helpers_paths import REPO

pytest.importorskip("ray")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ray_benchmark_quick_run_prints_the_ratios() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "ray_executor.py"), "--quick"],
                          capture_output=True, text=True, timeout=360, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^round 1: submit->first batch local \d+ ms, ray \d+ ms", out, re.MULTILINE), out
    assert re.search(r"^runner overhead per trial, ray / local: median of 1 round ratios \d+\.\d+x$", out, re.M), out
    assert re.search(r"^round 1: 2-slot trial submit->first batch one node \d+ ms, two nodes \d+ ms", out, re.M), out
    assert re.search(r"^multi-node start-up, two nodes / one node \(2 slots\): median of 1 round ratios \d+\.\d+x$",
                     out, re.MULTILINE), out
    assert re.search(r"^store channel throughput, channel / direct SQLite \(2 writers\): median of 1 round ratios "
                     r"\d+\.\d+x$", out, re.MULTILINE), out
