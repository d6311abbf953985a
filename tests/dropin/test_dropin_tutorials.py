"""Issue 8, shows: scripts shaped like Determined 0.38's tutorials run with no edit but the import.
The mnist_pytorch tutorial (model_def/data/const.yaml, generated MNIST-shaped data) through
pytorch.init + Trainer.fit, `det-trials experiment create`, and the 2-process launcher; the Core API
distributed tutorial under the torch_distributed launcher with 2 slots."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.helpers_experiment import create
from support.helpers_paths import SUPPORT

import determined_trials as det
from determined_trials import pytorch
from determined_trials.core import LocalStore

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)

TUTORIALS = SUPPORT / "det_tutorials"
MNIST = TUTORIALS / "mnist_pytorch"


def _copy(src: Path, tmp_path: Path) -> Path:
    target = tmp_path / src.name
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def test_the_tutorials_differ_from_determined_only_in_imports() -> None:
    """Every line naming our package is an import (or, in a config, the launcher module)."""
    for path in sorted(TUTORIALS.rglob("*")):
        if path.suffix not in (".py", ".yaml") or "__pycache__" in path.parts:
            continue
        for line in path.read_text().splitlines():
            if "determined_trials" not in line:
                continue
            code = line.strip()
            allowed = code.startswith(("import determined_trials", "from determined_trials"))
            allowed = allowed or (path.suffix == ".yaml" and "determined_trials.launch.torch_distributed" in code)
            assert allowed, f"{path.relative_to(TUTORIALS)}: {line}"


def test_mnist_tutorial_runs_through_init_and_trainer_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _copy(MNIST, tmp_path)
    monkeypatch.chdir(folder)
    monkeypatch.delenv("DET_CLUSTER_INFO", raising=False)
    monkeypatch.setenv("DET_RUN_DIR", str(tmp_path / "runs"))
    with det.import_from_path(folder):
        import train  # the tutorial's script, run as its __main__ would with --batches 4

        train.run(pytorch.Batch(4), local=det.get_cluster_info() is None)
    store = LocalStore(tmp_path / "runs")
    (trial,) = store.trials()
    validation = store.metrics(trial.id, "validation")
    assert [m.steps_completed for m in validation] == [4]
    assert {"validation_loss", "accuracy", "batch"} <= set(validation[0].metrics)
    assert [c.steps_completed for c in store.checkpoints(trial_id=trial.id)] == [4]
    assert store.trial(trial.id).progress == 1.0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("config", "ranks"), [("const.yaml", 1), ("distributed.yaml", 2)])
def test_mnist_tutorial_runs_as_an_experiment(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              config: str, ranks: int) -> None:
    folder = _copy(MNIST, tmp_path)
    run_dir = tmp_path / "runs"
    assert create(run_dir, folder / config, folder) == 0
    out = capsys.readouterr().out
    store = LocalStore(run_dir)
    assert store.experiment(1).state == "COMPLETED"
    (trial,) = store.trials(1)
    assert trial.state == "COMPLETED" and trial.restarts == 0
    assert [op.length for op in store.searcher_ops(trial.id) if op.completed] == [8]  # the searcher got its metric
    assert [m.steps_completed for m in store.metrics(trial.id, "validation")] == [8]
    assert store.trial(trial.id).progress == 1.0
    assert "exited without reporting" not in out
    if ranks == 2:
        assert "[rank=0] [validation] batch 8" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_core_api_distributed_tutorial_runs_with_two_slots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(TUTORIALS / "core_api", tmp_path)
    run_dir = tmp_path / "runs"
    assert create(run_dir, folder / "distributed.yaml", folder) == 0
    out = capsys.readouterr().out
    store = LocalStore(run_dir)
    (trial,) = store.trials(1)
    assert store.experiment(1).state == "COMPLETED" and trial.state == "COMPLETED"
    # each of the 10 steps adds rank 0's 1 and rank 1's 2, met in an allgather
    assert store.metrics(trial.id, "validation")[-1].metrics["x"] == 30
    assert '[rank=1] cluster {"slot_ids": [0, 1], "container_slot_counts": [2], "gpu_uuids": []' in out
