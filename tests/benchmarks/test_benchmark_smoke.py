"""Smoke test of ``benchmarks/overhead.py --quick``: it runs end to end and prints its ratio lines (no timing checks)."""

from __future__ import annotations

import re
import sys

import pytest
from helpers_group_run import run_in_group
from helpers_paths import REPO

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)



# Timeouts: what a loaded machine (load 10 on 2 cores) needs; each benchmark runs in a process group of
# its own, killed with the test (run_in_group), so none of its children outlives it.
QUICK_S = 900  # one --quick benchmark: 8 (overhead) or a few child processes that each import torch


@pytest.mark.slow
@pytest.mark.timeout(QUICK_S + 60)
def test_overhead_benchmark_quick_run_prints_the_ratios() -> None:
    proc = run_in_group([sys.executable, str(REPO / "benchmarks" / "overhead.py"), "--quick"], timeout=QUICK_S,
                        cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for mode in ("raw", "trial", "raw-ckpt", "trial-ckpt"):
        assert re.search(rf"^{re.escape(mode)}\s+\d+\.\d+", out, re.MULTILINE), out
    assert re.search(r"^trial / raw: ratio of medians \d+\.\d+x", out, re.MULTILINE), out
    final = re.search(r"^overhead ratio \(no ckpt\): (\d+\.\d+)x, \(ckpt every (\d+)\): (\d+\.\d+)x$", out, re.MULTILINE)
    assert final is not None, out
    assert float(final.group(1)) > 0 and float(final.group(3)) > 0
    assert "checkpoints=4" in out and "checkpoints=1" in out  # trial-ckpt: every 50 of 200; trial: the final one


@pytest.mark.slow
@pytest.mark.timeout(2 * QUICK_S + 60)
def test_async_checkpoint_and_resume_benchmarks_quick_runs_print_their_summaries() -> None:
    for script, pattern in (
        ("async_checkpoint.py", r"^async blocking fraction \(median of per-round ratios to torch.save\): \d+\.\d+; "
                                r"first checkpoint: \d+\.\d+; synchronous: \d+\.\d+\n"
                                r"last checkpoint of fit: \d+\.\d+ ms, \d+\.\d+ of torch.save \+ fsync"),
        ("resume_cost.py", r"^resume into 100000 shuffled records, 2 rounds, medians: .*records read to skip: 0$"),
    ):
        proc = run_in_group([sys.executable, str(REPO / "benchmarks" / script), "--quick"], timeout=QUICK_S,
                            cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert re.search(pattern, proc.stdout, re.MULTILINE), proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(QUICK_S + 60)
def test_fsdp_benchmark_quick_run_prints_its_ratios() -> None:
    proc = run_in_group([sys.executable, str(REPO / "benchmarks" / "fsdp.py"), "--quick", "--timeout", str(QUICK_S)],
                        timeout=QUICK_S, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^held / synchronous dcp.save \(median of per-round ratios\): \d+\.\d+$", proc.stdout,
                     re.MULTILINE), proc.stdout
    assert re.search(r"FSDP2 / DDP \(median of per-round ratios\): \d+\.\d+$", proc.stdout, re.MULTILINE), proc.stdout
