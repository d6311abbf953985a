"""Experiments on a real two-node Ray cluster on 127.0.0.1 (`--ray ADDRESS`): trials spread over both
nodes and give the local executor's results; an optuna search; a killed trial process restarts from its checkpoint;
pause/continue; a checkpoint folder one node cannot see is refused before any trial runs."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.helpers_experiment import DET_TRIALS, create, final_states, make_context, when_stored
from support.helpers_paths import SUPPORT
from support.helpers_ray_cluster import LocalRayCluster, can_hide_folders, driving, start_ray_runner

from determined_trials.core import LocalStore
from determined_trials.experiment import summarize_trials

pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]



@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    hidden = tmp_path_factory.mktemp("node-private") if can_hide_folders() else None
    running = LocalRayCluster(hidden_on_second_node=hidden)
    with driving(running) as started:
        yield started


def _context(tmp_path: Path, hparams: dict[str, Any], **config: Any) -> tuple[Path, Path]:
    path, ctx = make_context(tmp_path, hparams, entrypoint="python3 ray_trial.py", **config)
    shutil.copy(SUPPORT / "trials_ray_script.py", ctx / "ray_trial.py")
    shutil.copy(SUPPORT / "trials_core_script.py", ctx / "trials_core_script.py")
    return path, ctx


def _rows(store: LocalStore) -> list[tuple[Any, ...]]:
    return [(s.trial_id, s.hparams, s.state, s.restarts, s.best_metric)
            for s in summarize_trials(store, 1, "loss", True)]


def test_grid_spreads_over_both_nodes_with_the_local_results(cluster: LocalRayCluster, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    config, ctx = _context(tmp_path, {"lr": {"type": "categorical", "vals": [0.1, 0.4, 0.7, 0.9]}, "sleep": 0.5},
                           searcher={"name": "grid", "metric": "loss", "max_length": 3})
    # three in flight on three CPUs (head 2, second node 1): one of them runs on the second node
    assert create(tmp_path / "ray", config, ctx, "--ray", cluster.address, "--max-parallel", "3") == 0
    out = capsys.readouterr().out
    assert create(tmp_path / "local", config, ctx) == 0
    on_ray, local = LocalStore(tmp_path / "ray"), LocalStore(tmp_path / "local")
    assert _rows(on_ray) == _rows(local) and len(_rows(on_ray)) == 4
    assert final_states(on_ray, 1) == final_states(local, 1)
    nodes = {t.metadata["node"] for t in on_ray.trials(1)}
    assert nodes == set(cluster.node_ids())
    assert {t.metadata["node"] for t in local.trials(1)} == {None}
    assert "[trial 1] done at step 3" in out
    assert (tmp_path / "ray" / "experiments" / "1" / "trial_4.log").read_text().strip().endswith("w=" + repr(
        final_states(on_ray, 1)[4]["w"]))



def test_a_pbt_search_on_ray_starts_each_child_from_its_parents_checkpoint(cluster: LocalRayCluster,
                                                                           tmp_path: Path) -> None:
    config, ctx = _context(tmp_path, {"lr": {"type": "double", "minval": 0.05, "maxval": 0.9}},
                           searcher={"name": "pbt", "metric": "loss", "population_size": 2, "num_rounds": 2,
                                     "length_per_round": 2, "replace_function": {"truncate_fraction": 0.5},
                                     "explore_function": {"resample_probability": 0.0, "perturb_factor": 0.2}})
    run_dir = tmp_path / "runs"
    assert create(run_dir, config, ctx, "--ray", cluster.address, "--max-parallel", "2") == 0
    store = LocalStore(run_dir)
    trials = store.trials(1)
    assert store.experiment(1).state == "COMPLETED" and [t.search_round for t in trials] == [1, 1, 2]
    child = trials[2]
    round_end = [c.uuid for c in store.checkpoints(trial_id=child.parent_trial_id, include_deleted=True)
                 if c.steps_completed == 2]
    log = (run_dir / "experiments" / "1" / f"trial_{child.id}.log").read_text()
    loaded = [line.split()[-1] for line in log.splitlines() if line.startswith("loaded checkpoint ")]
    assert child.parent_checkpoint == round_end[-1] == loaded[0]  # named by uuid, read from the shared storage
    assert child.metadata["node"] in cluster.node_ids() and final_states(store, 1)[child.id]["step"] == 4


def test_an_optuna_search_on_ray(cluster: LocalRayCluster, tmp_path: Path) -> None:
    """`searcher: optuna` with --ray as with the local executor: the suggestions the searcher makes for the seed,
    max_concurrent_trials in flight and no more, each trial told its metric once in the study's record."""
    optuna = pytest.importorskip("optuna")
    from determined_trials.config import load_config
    from determined_trials.searcher import make_searcher, restore_study

    searcher = {"name": "optuna", "metric": "loss", "max_length": 3, "max_trials": 3, "max_concurrent_trials": 2}
    config, ctx = _context(tmp_path, {"lr": {"type": "double", "minval": 0.1, "maxval": 0.9}, "sleep": 0.3},
                           searcher=searcher)
    assert create(tmp_path / "ray", config, ctx, "--ray", cluster.address, "--max-parallel", "3") == 0
    store = LocalStore(tmp_path / "ray")
    trials = store.trials(1)
    assert store.experiment(1).state == "COMPLETED" and [t.state for t in trials] == ["COMPLETED"] * 3
    in_process = make_searcher(load_config(config))  # TPE's first 10 are seeded draws: the same in any order
    expected = [r.hparams for r in in_process.initial_trials() + in_process.on_validation(0, 3, 1.0)]
    assert [t.hparams for t in trials] == expected
    assert all(t.metadata["node"] in cluster.node_ids() for t in trials)
    ends = sorted(t.end_time for t in trials if t.end_time is not None)
    assert sum(t.start_time < ends[0] for t in trials) == 2  # two in flight, the third asked after one ended
    study = restore_study(store.experiment(1).searcher_state["searcher"]["study"])
    told = {round(t.params["lr"], 12): t.value for t in study.get_trials(deepcopy=False)}
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert told == {round(r.hparams["lr"], 12): r.best_metric for r in summarize_trials(store, 1, "loss", True)}


def _checkpointed(steps: int, node: str | None = None) -> Callable[[LocalStore], tuple[int, int, int] | None]:
    """(trial id, checkpoint steps, trial pid) of a trial (on ``node``) with a checkpoint at ``steps`` or more."""
    def found(store: LocalStore) -> tuple[int, int, int] | None:
        for trial in store.trials(1):
            latest, meta = store.latest_checkpoint(trial.id), trial.metadata or {}
            if latest and latest.steps_completed >= steps and meta.get("pid") and node in (None, meta["node"]):
                return trial.id, latest.steps_completed, meta["pid"]
        return None
    return found


def _kill_trial_after_checkpoint(run_dir: Path, killed: list[int]) -> None:
    _, steps, pid = when_stored(run_dir, _checkpointed(2))
    os.kill(pid, signal.SIGKILL)
    killed.append(steps)


def test_a_killed_trial_process_restarts_from_its_checkpoint(cluster: LocalRayCluster, tmp_path: Path) -> None:
    config, ctx = _context(tmp_path, {"sleep": 0.4}, searcher={"name": "single", "metric": "loss", "max_length": 8})
    killed: list[int] = []
    killer = threading.Thread(target=_kill_trial_after_checkpoint, args=(tmp_path / "runs", killed))
    killer.start()
    assert create(tmp_path / "runs", config, ctx, "--ray", cluster.address) == 0
    killer.join(timeout=60)
    store = LocalStore(tmp_path / "runs")
    trial = store.trial(1)
    assert killed and trial.state == "COMPLETED" and trial.restarts == 1
    log = (tmp_path / "runs" / "experiments" / "1" / "trial_1.log").read_text()
    resumed = [int(line.split()[-1]) for line in log.splitlines() if line.startswith("resumed at step")]
    assert len(resumed) == 1 and resumed[0] >= killed[0]
    assert final_states(store, 1)[1]["step"] == 8


def test_pause_and_continue_on_ray(cluster: LocalRayCluster, tmp_path: Path) -> None:
    config, ctx = _context(tmp_path, {"sleep": 0.3, "ckpt_every": 2},
                           searcher={"name": "single", "metric": "loss", "max_length": 10})
    run_dir = tmp_path / "runs"
    proc = start_ray_runner(cluster, run_dir, config, ctx)
    try:
        when_stored(run_dir, _checkpointed(2))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=180) == 75, (tmp_path / "create.out").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    store = LocalStore(run_dir)
    assert store.experiment(1).state == "PAUSED" and store.trial(1).state == "PAUSED"
    paused_at = store.latest_checkpoint(1).steps_completed  # type: ignore[union-attr]
    resumed = subprocess.run([*DET_TRIALS, "--run-dir", str(run_dir), "experiment", "continue", "1",
                              "--no-progress", "--ray", cluster.address], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"[trial 1] resumed at step {paused_at}" in resumed.stdout
    assert store.experiment(1).state == "COMPLETED" and store.trial(1).restarts == 0
    assert final_states(store, 1)[1]["step"] == 10


def test_a_multi_slot_trial_gets_one_node_and_slots_no_even_split_holds_are_refused(
        cluster: LocalRayCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head = cluster.node_ids()[0]
    config, ctx = _context(tmp_path / "two", {}, resources={"slots_per_trial": 2},
                           searcher={"name": "single", "metric": "loss", "max_length": 2})
    assert create(tmp_path / "two" / "runs", config, ctx, "--ray", cluster.address) == 0
    assert LocalStore(tmp_path / "two" / "runs").trial(1).metadata["node"] == head  # the only 2-CPU node
    assert cluster.placement_groups() and set(cluster.placement_groups()) == {"REMOVED"}
    capsys.readouterr()
    config, ctx = _context(tmp_path / "three", {}, resources={"slots_per_trial": 3})
    assert create(tmp_path / "three" / "runs", config, ctx, "--ray", cluster.address) == 2
    err = capsys.readouterr().err
    assert "slots_per_trial is 3 but the Ray cluster offers 3 CPUs in total over 2 node(s) (CPUs per node: 2, 1)" in err
    assert "split evenly over the nodes" in err
    assert LocalStore(tmp_path / "three" / "runs").trials(1) == []


def test_when_the_runner_dies_its_trial_processes_end(cluster: LocalRayCluster, tmp_path: Path) -> None:
    config, ctx = _context(tmp_path, {"sleep": 0.3}, searcher={"name": "single", "metric": "loss", "max_length": 500})
    run_dir = tmp_path / "runs"
    runner = start_ray_runner(cluster, run_dir, config, ctx)
    try:
        _, _, pid = when_stored(run_dir, _checkpointed(2))
    finally:
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait(timeout=30)
    trial = psutil.Process(pid)
    # Ray ends the actors the runner owned; the trial process ends when the runner stops answering
    # (DET_STORE_CHANNEL_TIMEOUT: 30 s on this cluster) at the latest.
    trial.wait(timeout=240)
    cluster.wait_for_free_cpus(3)  # Ray ended the dead runner's actor and gave its CPU back
    store = LocalStore(run_dir)
    assert store.experiment(1).state == "ACTIVE" and store.trial(1).state == "ACTIVE"  # resumable records
    assert store.latest_checkpoint(1) is not None


def test_a_folder_one_node_cannot_see_is_refused_before_any_trial(cluster: LocalRayCluster, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    if cluster.hidden is None:
        pytest.skip("needs `unshare -m` to give the second Ray node a folder the head cannot share")
    config, ctx = _context(tmp_path, {}, checkpoint_storage=str(cluster.hidden / "ckpts"))
    assert create(tmp_path / "runs", config, ctx, "--ray", cluster.address) == 2
    err = capsys.readouterr().err
    named = re.search(rf"checkpoint storage {re.escape(str(cluster.hidden / 'ckpts'))} is a directory that "
                      r"Ray node\(s\) \S+ \(([0-9a-f]{12})\) cannot see", err)
    assert named is not None, err
    assert cluster.node_ids()[1].startswith(named.group(1))  # the second node, not the head
    assert "shared_fs" in err
    store = LocalStore(tmp_path / "runs")
    assert store.trials(1) == [] and store.experiment(1).state == "ERROR"
    assert list((cluster.hidden / "ckpts").iterdir()) == []


# Last in this module: it kills the cluster's second node.
def test_a_trial_on_a_dead_node_restarts_from_its_checkpoint_elsewhere(
        cluster: LocalRayCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head, second = cluster.node_ids()
    config, ctx = _context(tmp_path, {"lr": {"type": "categorical", "vals": [0.3, 0.6, 0.9]}, "sleep": 0.4},
                           searcher={"name": "grid", "metric": "loss", "max_length": 8})
    run_dir, killed = tmp_path / "runs", []
    killer = threading.Thread(target=_kill_node_under_a_trial, args=(cluster, run_dir, second, killed))
    killer.start()
    assert create(run_dir, config, ctx, "--ray", cluster.address, "--max-parallel", "3") == 0
    killer.join(timeout=60)
    assert killed, "no trial ran on the second node"
    store, (victim, at_step) = LocalStore(run_dir), killed[0]
    trial = store.trial(victim)
    assert trial.state == "COMPLETED" and trial.restarts == 1 and trial.metadata["node"] == head
    assert f"trial {victim} failed; restart 1 of 2 from its latest checkpoint" in capsys.readouterr().out
    log = (run_dir / "experiments" / "1" / f"trial_{victim}.log").read_text()
    assert [int(line.split()[-1]) >= at_step for line in log.splitlines() if line.startswith("resumed at")] == [True]
    assert {trial_id: state["step"] for trial_id, state in final_states(store, 1).items()} == {1: 8, 2: 8, 3: 8}


def _kill_node_under_a_trial(cluster: LocalRayCluster, run_dir: Path, node: str, killed: list[tuple[int, int]]) -> None:
    trial_id, steps, pid = when_stored(run_dir, _checkpointed(2, node))
    cluster.kill_second_node()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # a dead machine takes its processes along
    killed.append((trial_id, steps))
