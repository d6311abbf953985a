"""Smoke tests of the benchmarks' ``--quick`` runs: each runs end to end and prints its ratio lines (no timing
checks); their GPU code paths keep every tensor on ``--device`` (checked on the ``meta`` device); and
search_quality's warm start tells the second search the first one's trials."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import re
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from support.helpers_device_check import DeviceMixError, SameDevice, on_the_meta_device
from support.helpers_group_run import run_in_group
from support.helpers_paths import REPO

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)



# Timeouts: what a loaded machine (load 10 on 2 cores) needs; each benchmark runs in a process group of
# its own, killed with the test (run_in_group), so none of its children outlives it.
QUICK_S = 900  # one --quick benchmark: 8 (overhead) or a few child processes that each import torch


def _quick_run(script: str, *extra: str, timeout: float = QUICK_S) -> str:
    """What ``benchmarks/SCRIPT --quick EXTRA...`` printed, once it exited 0 (its process group killed at the end)."""
    proc = run_in_group([sys.executable, str(REPO / "benchmarks" / script), "--quick", *extra], timeout=timeout,
                        cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(QUICK_S + 60)
def test_overhead_benchmark_quick_run_prints_the_ratios() -> None:
    out = _quick_run("overhead.py")
    for mode in ("raw", "trial", "raw-ckpt", "trial-ckpt"):
        assert re.search(rf"^{re.escape(mode)}\s+\d+\.\d+", out, re.MULTILINE), out
    assert re.search(r"^trial / raw: ratio of medians \d+\.\d+x", out, re.MULTILINE), out
    final = re.search(r"^overhead ratio \(no ckpt\): (\d+\.\d+)x, \(ckpt every (\d+)\): (\d+\.\d+)x$", out, re.MULTILINE)
    assert final is not None, out
    assert float(final.group(1)) > 0 and float(final.group(3)) > 0
    assert "checkpoints=4" in out and "checkpoints=1" in out  # trial-ckpt: every 50 of 200; trial: the final one


@pytest.mark.slow
@pytest.mark.timeout(QUICK_S + 60)
def test_trial_start_benchmark_quick_run_prints_the_search_and_start_figures() -> None:
    out = _quick_run("trial_start.py")
    for mode in ("cold", "warm"):
        assert re.search(rf"^round 1/1, search of 4 trials, {mode}: experiment wall \d+\.\d s = \d+\.\d+x", out,
                         re.MULTILINE), out
        assert re.search(rf"^{mode}: experiment wall / the trials' training, median of 1 searches", out,
                         re.MULTILINE), out
    assert re.search(r"^warm / cold: experiment wall \d+\.\d+x", out, re.MULTILINE), out
    assert re.search(r"^trial process start to first batch, 1 rounds, medians: fresh", out, re.MULTILINE), out


@pytest.mark.slow
@pytest.mark.timeout(2 * QUICK_S + 60)
def test_async_checkpoint_and_resume_benchmarks_quick_runs_print_their_summaries() -> None:
    for script, pattern in (
        ("async_checkpoint.py", r"^async blocking fraction \(median of per-round ratios to torch.save\): \d+\.\d+; "
                                r"first checkpoint: \d+\.\d+; synchronous: \d+\.\d+\n"
                                r"last checkpoint of fit: \d+\.\d+ ms, \d+\.\d+ of torch.save \+ fsync"),
        ("resume_cost.py", r"^resume into 100000 shuffled records, 2 rounds, medians: .*records read to skip: 0$"),
    ):
        out = _quick_run(script)
        assert re.search(pattern, out, re.MULTILINE), out


@pytest.mark.slow
@pytest.mark.timeout(QUICK_S + 60)
def test_fsdp_benchmark_quick_run_prints_its_ratios() -> None:
    out = _quick_run("fsdp.py", "--timeout", str(QUICK_S))
    assert re.search(r"^held / synchronous dcp.save \(median of per-round ratios\): \d+\.\d+$", out,
                     re.MULTILINE), out
    assert re.search(r"FSDP2 / DDP \(median of per-round ratios\): \d+\.\d+$", out, re.MULTILINE), out


@pytest.mark.slow
@pytest.mark.timeout(QUICK_S + 60)
@pytest.mark.parametrize(("script", "calls"), [("hsdp.py", "model calls"), ("zero3.py", "engine calls")])
def test_per_batch_benchmark_quick_run_prints_its_rounds_and_summary(script: str, calls: str) -> None:
    out = _quick_run(script, "--timeout", str(QUICK_S))
    assert len(re.findall(r"^round \d/2: Trainer.fit \d+\.\d+ ms/batch", out, re.MULTILINE)) == 2, out
    assert re.search(r"Trainer.fit / raw \(median of per-round ratios\): \d+\.\d+ \(95 % interval of the median "
                     rf"\d+\.\d+-\d+\.\d+; rounds \d+\.\d+-\d+\.\d+\); outside the {calls} .*: Trainer.fit "
                     r"\d+\.\d+ ms/batch, raw \d+\.\d+ ms/batch; CPU of all threads: Trainer.fit \d+\.\d+ ms/batch, "
                     r"raw \d+\.\d+ ms/batch$", out, re.MULTILINE), out


@pytest.mark.timeout(300)
def test_ui_latency_benchmark_quick_run_prints_its_figures() -> None:
    pytest.importorskip("uvicorn", reason="the ui extra (starlette, uvicorn) is not installed")
    out = _quick_run("ui_latency.py", timeout=240)
    number = r"\d+\.\d+"
    for call in ("/api/v1/experiments", "/api/v1/experiments/1/trials", "/api/v1/trials/{t}/logs?tail=200",
                 "all calls"):
        assert re.search(rf"^{re.escape(call)}\s+{number}\s+{number}\s+{number}\s+\d+$", out,
                         re.MULTILINE), out
    assert re.search(rf"^ui latency p50 over all API calls: {number} ms \(target <= 5 ms\)$", out,
                     re.MULTILINE), out


@pytest.mark.slow
@pytest.mark.timeout(QUICK_S + 60)
@pytest.mark.parametrize("self_check", [False, True], ids=["mlflow", "self-check"])
def test_tracker_overhead_benchmark_quick_run_prints_its_rounds_and_median(self_check: bool) -> None:
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    argv = [sys.executable, str(REPO / "benchmarks" / "tracker_overhead.py"), "--quick"]
    proc = run_in_group(argv + (["--self-check"] if self_check else []), timeout=QUICK_S, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    rounds, summary = lines[:-1], lines[-1]
    assert len(rounds) == summary["rounds"] == 2 and summary["self_check"] is self_check
    assert all(r["ratio"] > 0 and r["on_ms"] > 0 and r["off_ms"] > 0 for r in rounds)
    assert summary["ratio_spread"] == [min(r["ratio"] for r in rounds), max(r["ratio"] for r in rounds)]
    # Only the tracked arm opens MLflow runs: the self-check's fits print no run link and start no tracker helper
    # process (found by its command line: a renamed module would read 0 CPU here).
    assert ("View run tracker-overhead" in proc.stdout + proc.stderr) is not self_check
    assert all((r["helper_cpu_ms"] > 0) is not self_check for r in rounds), rounds


# -- every tensor on the device ----------------------------------------------------------------------


def _benchmark(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return importlib.import_module(name)


def test_the_device_check_fails_an_op_that_mixes_host_and_device_tensors() -> None:
    host, device = torch.zeros(()), torch.ones((), device="meta")
    with SameDevice():
        with pytest.raises(DeviceMixError, match=r"got tensors on \['cpu', 'meta'\]"):
            host += device  # what the raw loop's validation did on CUDA
        with pytest.raises(DeviceMixError):
            torch.nn.functional.linear(torch.zeros(2, 3), torch.zeros(4, 3, device="meta"))
        assert (device * 2).item() == 0 and device.cpu().device.type == "cpu"  # reads and transfers pass


def test_the_overhead_benchmarks_loops_keep_every_tensor_on_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    overhead = _benchmark("overhead", monkeypatch)
    parser = argparse.ArgumentParser()
    overhead.add_shape_arguments(parser)
    args = parser.parse_args(["--batches", "12", "--period", "6", "--report", "4", "--variant"])
    args.device = "meta"  # what --device cuda does, with a device that is not the default one
    with on_the_meta_device(monkeypatch):
        raw = overhead._raw_loop(args, True, tmp_path)
        trial = overhead._trial_fit(args, True, tmp_path / "run")
    assert {path.name for path in tmp_path.glob("ckpt-*.pth")} == {"ckpt-6.pth", "ckpt-12.pth"}
    assert raw["loss"] == 0 and trial["checkpoints"] == 2  # meta tensors read as zeros; 1 periodic + the final


def test_the_async_checkpoint_benchmarks_fits_keep_every_tensor_on_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    bench = _benchmark("async_checkpoint", monkeypatch)
    args = argparse.Namespace(batches=6, period=3, device="meta", width=16, optimizer="adamw", batch=4)
    with on_the_meta_device(monkeypatch):
        for asynchronous in (True, False):
            timer, trial = bench._fit(args, tmp_path / f"run-{asynchronous}", asynchronous)
            assert timer.calls == 1 and trial.context.device.type == "meta"


def test_search_quality_warm_start_tells_the_second_search_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("optuna")
    bench = _benchmark("search_quality", monkeypatch)
    first = bench.run_search("optuna", 0, 6)
    told = bench.run_search("optuna", 1, 4, first)  # asserts every earlier trial was added to the study
    assert len(told) == 4 and all(math.isfinite(m) for _, m in told)
    bests = bench.warm_start_bests(0, 8)
    assert set(bests) == {"cold", "warm", "two_cold"}
    assert bests["warm"] <= min(m for _, m in bench.run_search("optuna", 0, 4))  # the best over both halves


# -- the rounds' summary ---------------------------------------------------------------------------


def test_the_median_interval_holds_the_median_narrows_with_more_rounds_and_repeats(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rounds = _benchmark("_rounds", monkeypatch)
    gen = torch.Generator().manual_seed(3)
    few = (1.0 + 0.08 * torch.randn(9, generator=gen)).tolist()
    many = (1.0 + 0.08 * torch.randn(81, generator=gen)).tolist()
    low, high = rounds.median_interval(few)
    assert low <= statistics.median(few) <= high and low < high
    assert rounds.median_interval(few) == (low, high)  # seeded: the same rounds give the same interval
    many_low, many_high = rounds.median_interval(many)
    assert many_high - many_low < (high - low) / 2  # 9x the rounds: about a third of the width
    assert rounds.median_interval([1.02]) == (1.02, 1.02)
    with pytest.raises(ValueError, match="at least one value"):
        rounds.median_interval([])
