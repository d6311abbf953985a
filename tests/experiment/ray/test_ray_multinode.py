"""One trial over two Ray nodes (a real cluster on 127.0.0.1, 1 CPU a node, gloo): the 2-slot trial is
spread, one launcher per node, and trains like one node with two processes; a rank killed on one node
stops both and the trial resumes from its checkpoint to the same weights; a trial larger than the
cluster is refused before anything runs; every rank's lines reach the runner's trial log."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.helpers_experiment import DET_TRIALS, create, when_stored
from support.helpers_paths import SUPPORT
from support.helpers_ray_cluster import LocalRayCluster, driving, start_ray_runner

from determined_trials.cli._trial import write_trial_table
from determined_trials.cli.main import main
from determined_trials.core import LocalStore

pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.usefixtures("cpu_device")]

RANK_LINE = re.compile(r"^\[rank=(\d)\] rank (\d) of 2 on node (\S+) pid (\d+)$")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    running = LocalRayCluster(head_cpus=1)
    with driving(running) as started:
        yield started


def _context(folder: Path, slots: int = 2, trials: int = 1, **hparams: Any) -> tuple[Path, Path]:
    ctx = folder / "ctx"
    ctx.mkdir(parents=True)
    shutil.copy(SUPPORT / "trials_ray_spread_pytorch.py", ctx / "spread_trial.py")
    config = {
        "name": "spread", "entrypoint": "python3 -m determined_trials.launch.torch_distributed --trial "
                                        "spread_trial.py:SpreadTrial",
        "hyperparameters": {"global_batch_size": 8, "sleep": 0.0, **hparams},
        "searcher": {"name": "grid" if trials > 1 else "single", "metric": "validation_loss",
                     "max_length": {"batches": 12}},
        "min_validation_period": {"batches": 4}, "min_checkpoint_period": {"batches": 4},
        "resources": {"slots_per_trial": slots}, "reproducibility": {"experiment_seed": 7}, "max_restarts": 2,
    }
    if trials > 1:  # the same trial several times (the hyperparameter is not used)
        config["hyperparameters"]["copy"] = {"type": "categorical", "vals": list(range(trials))}
    path = folder / "const.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, ctx


def _validation(store: LocalStore, trial_id: int = 1) -> list[float]:
    return [m.metrics["validation_loss"] for m in store.metrics(trial_id, group="validation")]


def _weights(store: LocalStore, trial_id: int = 1) -> dict[str, Any]:
    latest = store.latest_checkpoint(trial_id)
    assert latest is not None
    state = torch.load(store.path / "checkpoints" / latest.uuid / "state_dict.pth", weights_only=False)
    return dict(state["models_state_dict"][0])


def _ranks(log: Path) -> dict[int, tuple[str, int]]:
    """rank -> (Ray node id, pid) from the ranks' first lines in the runner's trial log."""
    found: dict[int, tuple[str, int]] = {}
    for line in log.read_text().splitlines():
        match = RANK_LINE.match(line)
        if match:
            assert match.group(1) == match.group(2)
            found[int(match.group(1))] = (match.group(3), int(match.group(4)))
    return found


def _watch_waiting(run_dir: Path, seen: list[str], done: threading.Event) -> None:
    """Keep the first `trial list` table in which one trial waits for Ray while another was placed."""
    while not done.wait(0.1):
        if not (run_dir / "store.sqlite").exists():
            continue
        store = LocalStore(run_dir)
        try:
            trials = store.trials(1)
        except KeyError:  # the experiment is not recorded yet
            continue
        finally:
            store.close()
        statuses = [t.status or "" for t in trials if t.state == "ACTIVE"]
        waiting = [status for status in statuses if status.startswith("waiting for Ray")]
        if waiting and len(waiting) < len(statuses) and all(statuses):  # one waits, the other was placed
            table = io.StringIO()
            write_trial_table(table, trials, fit=400)
            seen.append(table.getvalue())
            return


@pytest.fixture(scope="module")
def spread_run(cluster: LocalRayCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Two copies of a 2-slot trial on the 1-CPU-a-node cluster (one waits for the other), uninterrupted:
    the run folder and the `trial list` table seen while one waited."""
    folder = tmp_path_factory.mktemp("spread")
    config, ctx = _context(folder, trials=2)
    seen: list[str] = []
    done = threading.Event()
    watcher = threading.Thread(target=_watch_waiting, args=(folder / "runs", seen, done))
    watcher.start()
    try:
        assert create(folder / "runs", config, ctx, "--ray", cluster.address) == 0
    finally:
        done.set()
        watcher.join(timeout=30)
    return folder / "runs", seen


def test_two_slots_spread_over_two_nodes_equal_one_node_with_two_processes(
        cluster: LocalRayCluster, spread_run: tuple[Path, list[str]], tmp_path: Path) -> None:
    store = LocalStore(spread_run[0])
    config, ctx = _context(tmp_path)
    assert create(tmp_path / "local", config, ctx) == 0  # one machine, two processes (the local executor)
    local = LocalStore(tmp_path / "local")
    assert len(_validation(local)) == 3
    for trial_id in (1, 2):
        assert store.trial(trial_id).state == "COMPLETED" and store.trial(trial_id).restarts == 0
        log = spread_run[0] / "experiments" / "1" / f"trial_{trial_id}.log"
        ranks = _ranks(log)
        assert sorted(ranks) == [0, 1], log.read_text()
        assert {node for node, _ in ranks.values()} == set(cluster.node_ids())  # one rank on each node
    # trial 1 has the local run's seed (trial 2's seed, hence its initial weights, differ)
    assert _validation(store) == pytest.approx(_validation(local), rel=1e-6)
    for name, tensor in _weights(local).items():
        assert torch.allclose(_weights(store)[name], tensor, rtol=1e-6, atol=0), name
    assert set(cluster.placement_groups()) == {"REMOVED"}


def test_a_trial_waiting_for_the_cluster_shows_as_waiting(spread_run: tuple[Path, list[str]]) -> None:
    assert spread_run[1], "never saw one trial wait while the other ran"
    rows = [line for line in spread_run[1][0].splitlines() if "ACTIVE" in line]
    assert any("waiting for Ray to place it (2 nodes x 1 CPU)" in row for row in rows), spread_run[1][0]


def test_logs_of_both_ranks_reach_the_runner(spread_run: tuple[Path, list[str]],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["--run-dir", str(spread_run[0]), "trial", "logs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("[rank=0] rank 0 of 2 on node") for line in lines), lines
    assert any(line.startswith("[rank=1] rank 1 of 2 on node") for line in lines), lines


def _deepspeed_context(folder: Path) -> tuple[Path, Path]:
    ctx = folder / "ctx"
    ctx.mkdir(parents=True)
    shutil.copy(SUPPORT / "trials_ray_spread_deepspeed.py", ctx / "spread_ds_trial.py")
    for helper in ("trials_deepspeed.py", "trials_pytorch.py"):
        shutil.copy(SUPPORT / helper, ctx / helper)
    config = {
        "name": "spread-ds", "entrypoint": "python3 -m determined_trials.launch.deepspeed --trial "
                                           "spread_ds_trial.py:SpreadDSTrial",
        "hyperparameters": {"global_batch_size": 8, "stage": 1, "micro": 4, "gas": 1},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 8}},
        "min_validation_period": {"batches": 4}, "resources": {"slots_per_trial": 2},
        "reproducibility": {"experiment_seed": 2024}, "max_restarts": 0,
    }
    path = folder / "const.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, ctx


def test_a_deepspeed_trial_spread_over_two_nodes_equals_one_node_with_two_ranks(
        cluster: LocalRayCluster, tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    config, ctx = _deepspeed_context(tmp_path)
    assert create(tmp_path / "ray", config, ctx, "--ray", cluster.address) == 0
    assert create(tmp_path / "local", config, ctx) == 0  # DeepSpeed's own launcher, 2 ranks here
    on_ray, local = LocalStore(tmp_path / "ray"), LocalStore(tmp_path / "local")
    log = tmp_path / "ray" / "experiments" / "1" / "trial_1.log"
    ranks = _ranks(log)
    assert sorted(ranks) == [0, 1] and {node for node, _ in ranks.values()} == set(cluster.node_ids()), log.read_text()
    losses = [[m.metrics["val_loss"] for m in store.metrics(1, group="validation")] for store in (on_ray, local)]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], rel=1e-5)
    checkpoint = on_ray.latest_checkpoint(1)
    assert checkpoint is not None and {f"det_state_rank{r}.pth" for r in (0, 1)} <= set(checkpoint.resources)


def _keras_weights(run_dir: Path) -> dict[str, Any]:
    """Every array of the newest checkpoint's model.weights.h5 (h5py: no TensorFlow in this process)."""
    h5py = pytest.importorskip("h5py")
    newest = max(run_dir.rglob("model.weights.h5"), key=lambda p: p.stat().st_mtime_ns)
    arrays: dict[str, Any] = {}
    with h5py.File(newest, "r") as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return arrays


def test_a_keras_trial_spread_over_two_nodes_equals_one_node_with_two_workers(
        cluster: LocalRayCluster, tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    import numpy as np

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    shutil.copy(SUPPORT / "trials_ray_spread_keras.py", ctx / "spread_keras_trial.py")
    shutil.copy(SUPPORT / "trials_keras.py", ctx / "trials_keras.py")
    config = tmp_path / "const.yaml"
    config.write_text(yaml.safe_dump({
        "name": "spread-keras", "entrypoint": "python3 -m determined_trials.launch.tensorflow --trial "
                                              "spread_keras_trial.py:SpreadKerasTrial",
        "hyperparameters": {"global_batch_size": 16, "dropout": 0.0},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 6}},
        "resources": {"slots_per_trial": 2}, "reproducibility": {"experiment_seed": 5}, "max_restarts": 0,
    }))
    assert create(tmp_path / "ray", config, ctx, "--ray", cluster.address) == 0
    assert create(tmp_path / "local", config, ctx) == 0  # two workers on this machine
    log = tmp_path / "ray" / "experiments" / "1" / "trial_1.log"
    ranks = _ranks(log)
    assert sorted(ranks) == [0, 1] and {node for node, _ in ranks.values()} == set(cluster.node_ids()), log.read_text()
    spread, local = _keras_weights(tmp_path / "ray"), _keras_weights(tmp_path / "local")
    assert sorted(spread) == sorted(local) and len(local) > 4
    for name in local:  # the same arithmetic up to the order of float sums in the all-reduce
        np.testing.assert_allclose(spread[name], local[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_more_slots_than_the_cluster_has_are_refused_before_anything_runs(
        cluster: LocalRayCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, ctx = _context(tmp_path, slots=4)
    assert create(tmp_path / "runs", config, ctx, "--ray", cluster.address) == 2
    err = capsys.readouterr().err
    assert "resources.slots_per_trial is 4 but the Ray cluster offers 2 CPUs in total over 2 node(s)" in err, err
    assert LocalStore(tmp_path / "runs").trials(1) == []


def _actor_of(pid: int) -> int:
    """The Ray actor's worker process above a rank's process."""
    import psutil

    for parent in psutil.Process(pid).parents():
        if "TrialActor" in " ".join(parent.cmdline()) or "TrialActor" in parent.name():
            return parent.pid
    raise AssertionError(f"no TrialActor above process {pid}")


def _kill_part_of_node_one(run_dir: Path, what: str, killed: list[int], cluster: LocalRayCluster,
                           seen: list[bool]) -> None:
    def checkpointed(store: LocalStore) -> int | None:
        latest = store.latest_checkpoint(1) if store.trials(1) else None
        return latest.steps_completed if latest else None

    steps = when_stored(run_dir, checkpointed)
    log = run_dir / "experiments" / "1" / "trial_1.log"
    _, pid = when_stored(run_dir, lambda _: _ranks(log).get(1))
    # the check that nothing is left at the end can see this cluster's trial processes
    seen.append(pid in [proc.pid for proc in cluster.processes("spread_trial.py:SpreadTrial")])
    # a rank dies mid-training, or the Ray worker that runs node 1's part (as when Ray loses it)
    os.kill(pid if what == "rank" else _actor_of(pid), signal.SIGKILL)
    killed.append(steps)


@pytest.mark.parametrize("what", ["rank", "actor"])
def test_a_part_killed_on_one_node_restarts_the_trial_from_its_checkpoint(
        cluster: LocalRayCluster, spread_run: tuple[Path, list[str]], tmp_path: Path, what: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    config, ctx = _context(tmp_path, sleep=0.5)
    killed: list[int] = []
    seen: list[bool] = []
    killer = threading.Thread(target=_kill_part_of_node_one, args=(tmp_path / "runs", what, killed, cluster, seen))
    killer.start()
    assert create(tmp_path / "runs", config, ctx, "--ray", cluster.address) == 0
    killer.join(timeout=60)
    assert killed and seen == [True]
    store = LocalStore(tmp_path / "runs")
    assert store.trial(1).state == "COMPLETED" and store.trial(1).restarts == 1
    out = capsys.readouterr().out
    assert "trial 1 failed; restart 1 of 2 from its latest checkpoint" in out
    uninterrupted = _weights(LocalStore(spread_run[0]))
    for name, tensor in _weights(store).items():
        assert torch.equal(tensor, uninterrupted[name]), name
    assert cluster.processes("spread_trial.py:SpreadTrial") == []  # no rank or launcher of the trial left
    cluster.wait_for_free_cpus(2, timeout=60)  # every actor of the failed run ended


def test_pause_stops_both_nodes_with_one_checkpoint_and_continue_finishes_it(
        cluster: LocalRayCluster, spread_run: tuple[Path, list[str]], tmp_path: Path) -> None:
    config, ctx = _context(tmp_path, sleep=0.5)
    run_dir = tmp_path / "runs"
    runner = start_ray_runner(cluster, run_dir, config, ctx)
    try:
        when_stored(run_dir, lambda store: store.trials(1) and store.latest_checkpoint(1))
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=180) == 75, (tmp_path / "create.out").read_text()
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(timeout=30)
    assert cluster.processes("spread_trial.py:SpreadTrial") == []  # no rank or launcher of the trial left
    store = LocalStore(run_dir)
    assert store.experiment(1).state == "PAUSED" and store.trial(1).state == "PAUSED"
    steps = [c.steps_completed for c in store.checkpoints(trial_id=1)]
    assert len(steps) == len(set(steps)) and max(steps) < 12  # one checkpoint per stop, none twice
    resumed = subprocess.run([*DET_TRIALS, "--run-dir", str(run_dir), "experiment", "continue", "1",
                              "--no-progress", "--ray", cluster.address], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"(step {max(steps)}): training to 12 batches" in resumed.stdout
    assert store.experiment(1).state == "COMPLETED" and store.trial(1).restarts == 0
    uninterrupted = _weights(LocalStore(spread_run[0]))
    for name, tensor in _weights(store).items():
        assert torch.equal(tensor, uninterrupted[name]), name


def test_an_fsdp2_trial_spread_over_two_nodes_equals_one_machine(cluster: LocalRayCluster, tmp_path: Path) -> None:
    """The FSDP2 example with 2 slots on the 1-CPU-a-node cluster: one rank a node, one DCP shard a rank, and
    every saved tensor (weights and AdamW state) as the same trial run on this machine with two processes."""
    from support.helpers_fsdp_example import EXAMPLE, dcp_tensors, fsdp_config, last_checkpoint

    shutil.copytree(EXAMPLE, tmp_path / "code")
    config = fsdp_config(tmp_path, "fsdp.yaml")
    assert create(tmp_path / "ray", config, tmp_path / "code", "--ray", cluster.address) == 0
    assert create(tmp_path / "local", config, tmp_path / "code") == 0
    (_, spread), (_, local) = last_checkpoint(tmp_path / "ray"), last_checkpoint(tmp_path / "local")
    assert sorted(p.name for p in (spread / "dcp").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    spread_tensors, local_tensors = dcp_tensors(spread), dcp_tensors(local)
    assert sorted(spread_tensors) == sorted(local_tensors) and spread_tensors
    for name, tensor in local_tensors.items():
        assert torch.allclose(spread_tensors[name], tensor, rtol=1e-6, atol=1e-7), name
    assert set(cluster.placement_groups()) == {"REMOVED"}
