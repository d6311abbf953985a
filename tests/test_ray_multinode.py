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
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from _experiment_helpers import create
from _ray_cluster import LocalRayCluster
from test_ray_executor import _when

from determined_trials.cli._trial import write_trial_table
from determined_trials.cli.main import main
from determined_trials.core import LocalStore

pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.usefixtures("cpu_device")]

TESTS = Path(__file__).parent
RANK_LINE = re.compile(r"^\[rank=(\d)\] rank (\d) of 2 on node (\S+) pid (\d+)$")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    running = LocalRayCluster(head_cpus=1)
    saved = {name: os.environ.get(name) for name in running.driver_env}
    os.environ.update(running.driver_env)
    try:
        yield running.start()
    finally:
        running.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    assert running.leftovers() == []


def _context(folder: Path, slots: int = 2, trials: int = 1, **hparams: Any) -> tuple[Path, Path]:
    ctx = folder / "ctx"
    ctx.mkdir(parents=True)
    shutil.copy(TESTS / "_ray_spread_trial.py", ctx / "spread_trial.py")
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
    """Keep the first `trial list` table in which one trial waits for Ray while another trains."""
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
        statuses = {t.status for t in trials if t.state == "ACTIVE"}
        if "training" in statuses and any((s or "").startswith("waiting for Ray") for s in statuses):
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
    assert spread_run[1], "never saw one trial wait while the other trained"
    rows = [line for line in spread_run[1][0].splitlines() if "ACTIVE" in line]
    assert any("waiting for Ray to place it (2 nodes x 1 CPU)" in row for row in rows), spread_run[1][0]


def test_logs_of_both_ranks_reach_the_runner(spread_run: tuple[Path, list[str]],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["--run-dir", str(spread_run[0]), "trial", "logs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("[rank=0] rank 0 of 2 on node") for line in lines), lines
    assert any(line.startswith("[rank=1] rank 1 of 2 on node") for line in lines), lines


def test_more_slots_than_the_cluster_has_are_refused_before_anything_runs(
        cluster: LocalRayCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, ctx = _context(tmp_path, slots=4)
    assert create(tmp_path / "runs", config, ctx, "--ray", cluster.address) == 2
    err = capsys.readouterr().err
    assert "resources.slots_per_trial is 4 but the Ray cluster offers 2 CPUs in total over 2 node(s)" in err, err
    assert LocalStore(tmp_path / "runs").trials(1) == []


def _kill_rank_one(run_dir: Path, killed: list[int]) -> None:
    def checkpointed(store: LocalStore) -> int | None:
        latest = store.latest_checkpoint(1) if store.trials(1) else None
        return latest.steps_completed if latest else None

    steps = _when(run_dir, checkpointed)
    log = run_dir / "experiments" / "1" / "trial_1.log"
    _, pid = _when(run_dir, lambda _: _ranks(log).get(1))
    os.kill(pid, signal.SIGKILL)  # one node's rank dies mid-training
    killed.append(steps)


def test_a_rank_killed_on_one_node_restarts_the_trial_from_its_checkpoint(
        cluster: LocalRayCluster, spread_run: tuple[Path, list[str]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    config, ctx = _context(tmp_path, sleep=0.5)
    killed: list[int] = []
    killer = threading.Thread(target=_kill_rank_one, args=(tmp_path / "runs", killed))
    killer.start()
    assert create(tmp_path / "runs", config, ctx, "--ray", cluster.address) == 0
    killer.join(timeout=60)
    assert killed
    store = LocalStore(tmp_path / "runs")
    assert store.trial(1).state == "COMPLETED" and store.trial(1).restarts == 1
    assert "trial 1 failed; restart 1 of 2 from its latest checkpoint" in capsys.readouterr().out
    uninterrupted = _weights(LocalStore(spread_run[0]))
    for name, tensor in _weights(store).items():
        assert torch.equal(tensor, uninterrupted[name]), name
    cluster.wait_for_free_cpus(2, timeout=60)  # every actor of the failed run ended
