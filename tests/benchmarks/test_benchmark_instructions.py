"""``benchmarks/instructions.py``: its callgrind totals parsing, its measured child run, the clear error
without valgrind, and (when valgrind is installed) a short end-to-end count of both modes."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
from support.helpers_group_run import run_in_group
from support.helpers_paths import REPO

SCRIPT = REPO / "benchmarks" / "instructions.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("det_bench_instructions", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_totals_reads_the_events_and_totals_lines(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text("version: 1\ncmd: python x.py\nevents: Ir D1mr Bim\nfn=(1) main\n3 10 2 1\ntotals: 120 7 3\n")
    assert _load()._totals(out) == {"Ir": 120, "D1mr": 7, "Bim": 3}


def test_totals_of_an_unfinished_file_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text("version: 1\nevents: Ir\n")
    with pytest.raises(RuntimeError, match="no events/totals"):
        _load()._totals(out)


# Timeouts: what a loaded machine (load 10 on 2 cores) needs, not what an idle one does; each run is
# in a process group of its own, killed with the test (run_in_group), so no valgrind is left behind.
@pytest.mark.slow
@pytest.mark.timeout(660)
@pytest.mark.parametrize("mode", ["raw", "trial"])
def test_child_runs_the_measured_part_without_valgrind(mode: str) -> None:
    proc = run_in_group([sys.executable, str(SCRIPT), "--child", mode, "--batches", "20", "--period", "10",
                         "--report", "5"], timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.timeout(660)
def test_without_valgrind_it_says_how_to_get_it(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # an empty folder: no valgrind on PATH
    proc = run_in_group([sys.executable, str(SCRIPT), "--batches", "5"], timeout=600, cwd=REPO, env=env)
    assert proc.returncode != 0
    assert "valgrind is not on PATH" in proc.stderr and "apt-get install valgrind" in proc.stderr


PER_MODE_S = 1500  # one callgrind run (torch's import under valgrind dominates), on a loaded machine


@pytest.mark.slow
@pytest.mark.timeout(2 * PER_MODE_S + 300)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (callgrind) on PATH")
def test_counts_the_instructions_of_both_modes_under_callgrind() -> None:
    """End to end with ``--no-sim`` (the cache simulation makes a run ~5 min even for 10 batches)."""
    proc = run_in_group([sys.executable, str(SCRIPT), "--batches", "10", "--period", "5", "--report", "5",
                         "--no-sim", "--timeout", str(PER_MODE_S)], timeout=2 * PER_MODE_S + 240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = re.search(r"^Ir\s+([\d,]+)\s+([\d,]+)\s+(\d+\.\d+)x", proc.stdout, re.MULTILINE)
    assert row is not None, proc.stdout
    raw, trial = (int(group.replace(",", "")) for group in row.groups()[:2])
    assert raw > 1_000_000 and trial > 1_000_000  # 10 batches of a real model, not an empty region
    assert "D1mr" not in proc.stdout  # not simulated
