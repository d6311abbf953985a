"""Concurrency tests for the local store: threads sharing one store, processes writing at once, fork."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from determined_trials.core import LocalStore


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "run")


@pytest.fixture
def trial_id(store: LocalStore) -> int:
    exp = store.create_experiment(name="exp", config={})
    return store.create_trial(experiment_id=exp, hparams={}, seed=0)


def test_threads_share_one_store(store: LocalStore, trial_id: int) -> None:
    errors: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            for step in range(50):
                store.add_metrics(trial_id=trial_id, group=f"g{worker}", steps_completed=step, metrics={"w": worker})
                store.trials()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and len(store.metrics(trial_id)) == 200


def _write_rows(run_dir: str, trial: int, rows: int, barrier: Any, results: Any) -> None:
    """Process body: open the store, wait for the others, then write ``rows`` metric rows."""
    try:
        store = LocalStore(run_dir)
        barrier.wait(timeout=60)
        start = time.monotonic()
        for step in range(rows):
            store.add_metrics(trial_id=trial, group="training", steps_completed=step,
                              metrics={"loss": 1.0 / (step + 1), "nested": {"step": step}})
        results.put(("ok", trial, start, time.monotonic()))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        results.put(("error", trial, repr(exc), 0.0))


def _run_processes(ctx: Any, target: Any, args_list: list[tuple[Any, ...]], results: Any) -> list[Any]:
    procs = [ctx.Process(target=target, args=args) for args in args_list]
    try:
        for proc in procs:
            proc.start()
        out = [results.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        return out
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)


@pytest.mark.slow
def test_four_processes_write_at_once(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    exp = store.create_experiment(name="e", config={})
    trials = [store.create_trial(experiment_id=exp, hparams={"i": i}, seed=i) for i in range(4)]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    out = _run_processes(ctx, _write_rows, [(str(tmp_path), t, 200, barrier, results) for t in trials], results)
    errors = [o for o in out if o[0] != "ok"]
    assert not errors, errors
    elapsed = max(o[3] for o in out) - min(o[2] for o in out)
    print(f"\n4 writers x 200 rows: {800 / elapsed:.0f} rows/s ({elapsed:.2f} s)")
    for trial in trials:
        records = store.metrics(trial)
        assert [r.steps_completed for r in records] == list(range(200))
        assert records[-1].metrics == {"loss": 1.0 / 200, "nested": {"step": 199}}
    total = sum(len(store.metrics(t)) for t in trials)
    assert total == 800


def _open_and_create(run_dir: str, index: int, barrier: Any, results: Any) -> None:
    """Process body: all processes open a brand-new run dir at once and record an experiment."""
    try:
        barrier.wait(timeout=60)
        store = LocalStore(run_dir)
        exp = store.create_experiment(name=f"e{index}", config={})
        store.create_trial(experiment_id=exp, hparams={}, seed=index)
        results.put(("ok", index))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        results.put(("error", repr(exc)))


@pytest.mark.slow
def test_processes_create_a_new_store_at_once(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "fresh")
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    out = _run_processes(ctx, _open_and_create, [(run_dir, i, barrier, results) for i in range(4)], results)
    assert all(o[0] == "ok" for o in out), out
    store = LocalStore(run_dir)
    assert sorted(e.name for e in store.experiments()) == ["e0", "e1", "e2", "e3"]
    assert len(store.trials()) == 4


def _forked_writer(store: LocalStore, trial: int, results: Any) -> None:
    """Process body for fork: reuse the parent's LocalStore object (it must reconnect)."""
    try:
        for step in range(100):
            store.add_metrics(trial_id=trial, group="child", steps_completed=step, metrics={"s": step})
        results.put(("ok", trial))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        results.put(("error", repr(exc)))


@pytest.mark.slow
@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_store_survives_fork(store: LocalStore, trial_id: int) -> None:
    store.add_metrics(trial_id=trial_id, group="parent", steps_completed=0, metrics={})
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    out = _run_processes(ctx, _forked_writer, [(store, trial_id, results), (store, trial_id, results)], results)
    assert all(o[0] == "ok" for o in out), out
    store.add_metrics(trial_id=trial_id, group="parent", steps_completed=1, metrics={})
    assert len(store.metrics(trial_id, "child")) == 200
    assert len(store.metrics(trial_id, "parent")) == 2
