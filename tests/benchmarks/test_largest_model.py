"""benchmarks/largest_model.py on the CPU: the search (doubling, halving, bisection, cap, tolerance, a
budget that ends it), how a try's end counts (oom, killed, too slow, error), and the ``--smoke`` run end
to end: each try a DeepSpeedTrial in a process of its own, a fake memory limit, JSON lines, the summary;
and a try does not outlive the search that started it."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.helpers_group_run import run_in_group
from support.helpers_paths import REPO

pytestmark = pytest.mark.usefixtures("cpu_device")

SMOKE_S = 600  # 8 child processes that each import torch and DeepSpeed, on a loaded machine


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return importlib.import_module("largest_model")


def _limit(limit: int, calls: list[int]) -> Callable[[int], bool | None]:
    def probe(size: int) -> bool:
        calls.append(size)
        return size <= limit
    return probe


def test_search_doubles_from_the_start_then_bisects_to_the_exact_limit(bench: ModuleType) -> None:
    calls: list[int] = []
    assert bench.search(_limit(37, calls), start=1, cap=100, tolerance=0.0) == (37, 38)
    assert calls == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]


def test_search_halves_while_the_start_fails(bench: ModuleType) -> None:
    calls: list[int] = []
    assert bench.search(_limit(5, calls), start=50, cap=100, tolerance=0.0) == (5, 6)
    assert calls == [50, 25, 12, 6, 3, 4, 5]


@pytest.mark.parametrize(("limit", "start", "want", "tries"), [
    (1000, 3, (10, 11), [3, 6, 10]),    # everything fits: it stops at the cap, tried once
    (0, 4, (0, 1), [4, 2, 1]),          # nothing fits, not even size 1
    (10, 50, (10, 11), [10]),           # a start above the cap starts at the cap
])
def test_search_stays_within_one_and_the_cap(bench: ModuleType, limit: int, start: int, want: tuple[int, int],
                                             tries: list[int]) -> None:
    calls: list[int] = []
    assert bench.search(_limit(limit, calls), start=start, cap=10, tolerance=0.0) == want
    assert calls == tries


def test_search_stops_within_the_tolerance(bench: ModuleType) -> None:
    calls: list[int] = []
    lo, hi = bench.search(_limit(37, calls), start=10, cap=1000, tolerance=0.1)
    assert lo <= 37 < hi and hi - lo <= max(1, int(0.1 * lo))
    assert calls == [10, 20, 40, 30, 35, 37]  # gap 40 - 37 = 3 <= 3.7: no more tries
    assert len(calls) < len([1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37])


def test_a_probe_without_verdict_ends_the_search_with_what_it_knew(bench: ModuleType) -> None:
    answers = iter([True, True, None])
    assert bench.search(lambda size: next(answers), start=2, cap=100, tolerance=0.0) == (4, 101)


def _args(bench: ModuleType, *extra: str) -> argparse.Namespace:
    args: argparse.Namespace = bench._parse(["--smoke", "--zero", "2", *extra])
    return args


def test_oom_killed_and_too_slow_tries_count_as_too_big(bench: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    ends = {1: "ok", 2: "ok", 3: "oom", 4: "killed"}
    tried: list[tuple[int, float]] = []

    def fake_try(args: Any, zero: int, offload: bool, depth: int, timeout: float) -> dict[str, Any]:
        tried.append((depth, timeout))
        return {"depth": depth, "params": depth * 10, "status": ends[depth], "samples_per_s": 1.0 * depth}

    monkeypatch.setattr(bench, "_run_try", fake_try)
    best = bench._search_config(_args(bench), 2, False)
    assert best == {"depth": 2, "params": 20, "status": "ok", "samples_per_s": 2.0}
    assert [d for d, _ in tried] == [1, 2, 4, 3]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line.get("status") for line in lines[1:-1]] == ["ok", "ok", "killed", "oom"]
    assert lines[-1] == {"config": "zero2", "largest_depth": 2, "smallest_failed_depth": 3, "largest_params": 20,
                         "samples_per_s": 2.0, "tokens_per_s": None}

    ends.update({3: "timeout", 4: "timeout"})  # slower than --try-timeout (the budget was not what cut it)
    tried.clear()
    assert bench._search_config(_args(bench), 2, False)["depth"] == 2
    ends[3] = "error"
    with pytest.raises(RuntimeError, match="depth 3 failed \\(not out of memory\\)"):
        bench._search_config(_args(bench), 2, False)


@pytest.mark.slow
@pytest.mark.timeout(SMOKE_S + 60)
def test_smoke_run_finds_the_fake_limit_for_both_configs_and_prints_the_ratio() -> None:
    proc = run_in_group([sys.executable, str(REPO / "benchmarks" / "largest_model.py"), "--smoke"],
                        timeout=SMOKE_S, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    block = 8 * 16 * 16 + 7 * 16
    for config, zero in (("zero2", 2), ("zero3_offload", 3)):
        tries = [r for r in records if r.get("config") == config and "status" in r]
        assert [(t["depth"], t["status"]) for t in tries] == [(1, "ok"), (2, "ok"), (4, "oom"), (3, "ok")], tries
        assert all(t["zero"] == zero and t["offload"] == (zero == 3) for t in tries)
        assert all(t["samples_per_s"] > 0 and t["tokens_per_s"] == pytest.approx(4 * t["samples_per_s"], rel=1e-3)
                   and t["params"] == t["depth"] * block and t["optimizer"] == "AdamW" and t["fused"] for t in tries if t["status"] == "ok")
        assert "fake: 8640 parameters" in tries[2]["message"]
    summary = next(r["summary"] | {"ratio": r["ratio"]} for r in records if "summary" in r)
    assert summary["zero2"]["params"] == summary["zero3_offload"]["params"] == 3 * block
    assert summary["ratio"] == 1.0
    assert lines[-1].startswith("largest model on one device: zero2: 6,480 parameters (depth 3)"), lines[-1]
    assert lines[-1].endswith("ratio 1.00x (goal >= 3x)"), lines[-1]


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not reaped yet counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
@pytest.mark.timeout(180)
def test_a_try_dies_with_the_search_that_started_it() -> None:
    """A device command cut short kills largest_model.py; its try (in a session of its own) must not live on
    holding the GPU. The try here would train 100000 steps (minutes)."""
    parent = textwrap.dedent(f"""
        import os, subprocess, sys, time
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu", DET_LARGEST_PARENT=str(os.getpid()))
        child = subprocess.Popen([sys.executable, {str(REPO / "benchmarks" / "_large_trial.py")!r}, "--smoke",
                                  "--zero", "2", "--depth", "1", "--width", "16", "--seq", "4", "--steps", "100000"],
                                 env=env, start_new_session=True, stderr=subprocess.DEVNULL)
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    try:
        time.sleep(8)  # into its imports or its training; either way past the start
        assert not _gone(child)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(child), "the try outlived the search that started it"
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)
