"""TFKerasTrials through the launchers with real processes: 2 MultiWorkerMirroredStrategy workers equal
1 worker on one global batch, SIGTERM then resume is bitwise exact, a failing worker ends the job within
seconds, and the legacy entrypoint (torch_distributed) hands a multi-slot TFKerasTrial to the tensorflow
launcher. Checkpoints are compared through h5py, so this process never imports TensorFlow."""

from __future__ import annotations

import shutil
import signal
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support.helpers_launch import Launch, launches_fixture  # noqa: F401 (the launches fixture)
from support.helpers_paths import REPO, SUPPORT

h5py = pytest.importorskip("h5py")
pytestmark = pytest.mark.slow

TRIALS = SUPPORT / "trials_keras.py"


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(TRIALS, code / "trials_keras.py")
    return code


def _config(folder: Path, name: str, slots: int, batches: int, **hparams: object) -> Path:
    hp = {"global_batch_size": 16, "dropout": 0.0, **hparams}
    path = folder / name
    path.write_text(textwrap.dedent(f"""
        hyperparameters: {hp!r}
        searcher: {{name: single, metric: val_loss, max_length: {{batches: {batches}}}}}
        resources: {{slots_per_trial: {slots}}}
        reproducibility: {{experiment_seed: 5}}
    """).replace("'", ""))
    return path


def _run(launches: list[Launch], code: Path, run_dir: Path, args: list[str], launcher: str = "tensorflow") -> Launch:
    launch = Launch(args, code, run_dir, launcher=launcher)
    launches.append(launch)
    return launch


def _final_state(run_dir: Path) -> dict[str, np.ndarray]:
    """Every array (weights and optimizer variables) of the newest checkpoint's model.weights.h5."""
    newest = max(run_dir.rglob("model.weights.h5"), key=lambda p: p.stat().st_mtime_ns)
    arrays: dict[str, np.ndarray] = {}
    with h5py.File(newest, "r") as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return arrays


def _completed(launch: Launch, timeout: float = 300) -> None:
    returncode, _ = launch.finish(timeout=timeout)
    assert returncode == 0, launch.output
    assert not launch.left_behind()


def test_two_workers_equal_one_worker_on_the_same_global_batch(launches: list[Launch], code_dir: Path,
                                                               tmp_path: Path) -> None:
    for slots in (1, 2):
        config = _config(tmp_path, f"c{slots}.yaml", slots, 9)
        _completed(_run(launches, code_dir, tmp_path / f"run{slots}",
                        ["--config", str(config), "--trial", "trials_keras.py:MLPTrial"]))
    one, two = _final_state(tmp_path / "run1"), _final_state(tmp_path / "run2")
    assert sorted(one) == sorted(two) and len(one) > 4
    for name in one:  # the same arithmetic up to the order of float sums in the all-reduce
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_sigterm_then_resume_is_bitwise_exact(launches: list[Launch], code_dir: Path, tmp_path: Path) -> None:
    whole = _config(tmp_path, "whole.yaml", 1, 9)
    _completed(_run(launches, code_dir, tmp_path / "whole", ["--config", str(whole), "--trial",
                                                             "trials_keras.py:MLPTrial"]))
    slow = _config(tmp_path, "slow.yaml", 1, 9, sleep=0.3)
    args = ["--config", str(slow), "--trial", "trials_keras.py:MLPTrial"]
    first = _run(launches, code_dir, tmp_path / "parts", args)
    first.wait_for(r"rank 0 trained a batch", timeout=180)
    first.proc.send_signal(signal.SIGTERM)
    returncode, _ = first.finish(timeout=180)
    assert returncode == 75, first.output
    stopped_after = first.output.count("trained a batch")
    assert 0 < stopped_after < 9
    _completed(_run(launches, code_dir, tmp_path / "parts", [*args[:2], "--latest-checkpoint", "latest", *args[2:]]))
    expected, got = _final_state(tmp_path / "whole"), _final_state(tmp_path / "parts")
    assert sorted(expected) == sorted(got)
    assert all(np.array_equal(expected[name], got[name]) for name in expected)


def test_a_failing_worker_ends_the_job_within_seconds(launches: list[Launch], code_dir: Path,
                                                      tmp_path: Path) -> None:
    config = _config(tmp_path, "fail.yaml", 2, 50, fail_rank=1, fail_at=2, sleep=0.1)
    launch = _run(launches, code_dir, tmp_path / "run", ["--config", str(config), "--trial",
                                                          "trials_keras.py:MLPTrial"])
    failed_at = launch.wait_for(r"boom on rank 1", timeout=240)
    returncode, ended = launch.finish(timeout=120)
    assert returncode != 0
    assert ended - failed_at < 30, launch.output  # fail grace 3 s, then every worker is killed
    assert "rank 1 failed" in launch.output
    assert not launch.left_behind()


HAND_OVER_S = 900  # TensorFlow imported three times (the --trial probe, two workers) on a loaded machine


@pytest.mark.timeout(HAND_OVER_S + 60)
def test_torch_distributed_hands_a_multi_slot_keras_trial_to_the_tensorflow_launcher(
    launches: list[Launch], code_dir: Path, tmp_path: Path,
) -> None:
    config = _config(tmp_path, "c.yaml", 2, 2)
    launch = _run(launches, code_dir, tmp_path / "run", ["--config", str(config), "--", "--trial",
                                                          "trials_keras.py:MLPTrial"], launcher="torch_distributed")
    _completed(launch, timeout=HAND_OVER_S)
    assert "MultiWorkerMirroredStrategy" in launch.output  # TensorFlow's own INFO line, from the chief
    # Ranks other than the chief log warnings only; each says once that it started, with its strategy.
    for rank in (0, 1):
        assert f"rank {rank} of 2 (local rank {rank}) training MLPTrial with " in launch.output
        assert f"[rank={rank}] det-trials: rank {rank} of 2" in launch.output
    assert launch.output.count("2 replicas in sync") == 2
    started = [line for line in launch.output.splitlines() if "rank 1 of 2" in line]
    assert started and all(line.startswith("[rank=1]") for line in started), started



def test_iris_example_runs_through_experiment_create(tmp_path: Path) -> None:
    import subprocess
    import sys

    example = REPO / "examples" / "iris_keras"
    config = tmp_path / "short.yaml"
    config.write_text((example / "const.yaml").read_text().replace("epochs: 30", "epochs: 2"))
    cmd = [sys.executable, "-m", "determined_trials.cli.main", "--run-dir", str(tmp_path / "run"), "experiment",
           "create", "--no-progress", str(config), str(example)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "COMPLETED" in out.stdout and "val_accuracy" in out.stdout
    assert list((tmp_path / "run").rglob("model.keras"))


def test_one_node_of_several_spawns_its_workers_with_global_ranks(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from determined_trials.config import load_config
    from determined_trials.launch import _args
    from determined_trials.launch._spawn import rank_environment
    from determined_trials.launch.tensorflow import build_command

    config = load_config(_config(tmp_path, "four.yaml", 4, 2))
    layout = {"DET_NNODES": "2", "DET_NODE_RANK": "1", "DET_CHIEF_IP": "10.0.0.5"}
    for name, value in layout.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(_args.LaunchError, match="DET_TF_WORKERS to the 4 workers' host:port"):
        build_command(_args.parse(["--trial", "m.py:T"], engine="tensorflow"), config)
    workers = "10.0.0.5:1,10.0.0.5:2,10.0.0.6:1,10.0.0.6:2"
    monkeypatch.setenv("DET_TF_WORKERS", workers)
    cmd, env = build_command(_args.parse(["--trial", "m.py:T"], engine="tensorflow"), config)
    assert cmd[cmd.index("determined_trials.launch._spawn") + 1] == "2"  # this node's two workers
    assert "DET_CHIEF_IP" not in env and "DET_JOB_ID" not in env  # shared by every node: from outside
    second = rank_environment(1, 2, {**layout, "DET_TF_WORKERS": workers})
    assert (second["RANK"], second["WORLD_SIZE"], second["LOCAL_RANK"], second["GROUP_RANK"]) == ("3", "4", "1", "1")
    assert json.loads(second["TF_CONFIG"])["task"] == {"type": "worker", "index": 3}
    alone = rank_environment(1, 2, {})
    assert (alone["RANK"], alone["WORLD_SIZE"], alone["GROUP_WORLD_SIZE"]) == ("1", "2", "1")
