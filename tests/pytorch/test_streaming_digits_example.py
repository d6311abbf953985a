"""examples/streaming_digits (scikit-learn's digits as a stream that saves its position) end to end: as a local
experiment (`det-trials experiment create`, two data-loader workers) it learns; through its train.py, a run stopped
mid-epoch and resumed from "latest" reads exactly the records of the uninterrupted run, batch by batch, and ends with
the same validation metrics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.helpers_experiment import create
from support.helpers_paths import REPO

from determined_trials.core import LocalStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLE = REPO / "examples" / "streaming_digits"
STOP_AFTER = 100  # batch 100 of 240: inside the third pass (batches 91-135)


def _train(run_dir: Path, records: Path, *extra: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "train.py", "--run-dir", str(run_dir), "--records", str(records),
                           "--no-progress", *extra], cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _validation(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    return [(m.steps_completed, m.metrics) for m in LocalStore(run_dir).metrics(1, "validation")]


def test_a_stopped_and_resumed_run_reads_exactly_the_uninterrupted_runs_records(tmp_path: Path) -> None:
    whole = _train(tmp_path / "whole", tmp_path / "whole.txt")
    assert "finished: completed" in whole
    stopped = _train(tmp_path / "stopped", tmp_path / "stopped.txt", "--stop-after-batches", str(STOP_AFTER))
    assert "finished: stopped" in stopped and f"trained batches 1-{STOP_AFTER};" in stopped
    resumed = _train(tmp_path / "stopped", tmp_path / "stopped.txt", "--resume", "latest")
    assert "finished: completed" in resumed and f"trained batches {STOP_AFTER + 1}-240;" in resumed

    lines = (tmp_path / "whole.txt").read_text().splitlines()
    assert len(lines) == 240 and [int(line.split()[0]) for line in lines] == list(range(1, 241))
    assert lines[STOP_AFTER].split()[1] == "2"  # the resumed run's first batch is in the middle of epoch 2
    assert (tmp_path / "stopped.txt").read_text().splitlines() == lines  # every batch: the same records, in order
    passes = [sorted(int(r) for line in lines[45 * e:45 * (e + 1)] for r in line.split()[2:]) for e in range(2)]
    assert passes[0] == passes[1] == list(range(1437))  # each pass reads every record once, in another order
    assert lines[0].split()[2:] != lines[45].split()[2:]
    assert _validation(tmp_path / "stopped") == _validation(tmp_path / "whole")


def test_the_example_learns_as_a_local_experiment(tmp_path: Path) -> None:
    config = yaml.safe_load((EXAMPLE / "const.yaml").read_text())
    config["hyperparameters"]["workers"] = 2
    config["searcher"]["max_length"] = {"batches": 120}
    path = tmp_path / "const.yaml"
    path.write_text(yaml.safe_dump(config))
    assert create(tmp_path / "runs", path, EXAMPLE) == 0
    store = LocalStore(tmp_path / "runs")
    assert store.trial(1).state == "COMPLETED"
    (_, first), (_, last) = _validation(tmp_path / "runs")
    assert last["validation_accuracy"] > 0.9 and last["validation_loss"] < first["validation_loss"]
