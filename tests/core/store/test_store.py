"""Tests for the local store (determined_trials.core.store._local): every write and read, errors, concurrency."""

from __future__ import annotations

import dataclasses
import math
import pickle
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from determined_trials.core.store._local import LocalStore, NotFoundError
from determined_trials.core.store._schema import SCHEMA_VERSION

_CONFIG = {
    "name": "exp",
    "hyperparameters": {"lr": {"type": "log", "base": 10, "minval": -3, "maxval": -1}},
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 100}},
}


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "run")


@pytest.fixture
def trial_id(store: LocalStore) -> int:
    exp = store.create_experiment(name="exp", config=_CONFIG)
    return store.create_trial(experiment_id=exp, hparams={"lr": 0.01}, seed=7)


# -- opening -------------------------------------------------------------------------------------
def test_open_creates_folder_schema_and_wal(tmp_path: Path) -> None:
    run_dir = tmp_path / "a" / "b"
    store = LocalStore(run_dir)
    assert store.path == run_dir.absolute()
    assert (run_dir / "store.sqlite").is_file()
    conn = sqlite3.connect(run_dir / "store.sqlite")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    conn.close()
    LocalStore(run_dir)  # idempotent: a second open neither fails nor adds a version row
    conn = sqlite3.connect(run_dir / "store.sqlite")
    assert conn.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 1
    conn.close()


def test_reopen_close_and_pickle(tmp_path: Path) -> None:
    first = LocalStore(tmp_path)
    exp = first.create_experiment(name="e", config={})
    first.close()
    assert LocalStore(tmp_path).experiment(exp).name == "e"
    assert first.experiment(exp).name == "e"  # reopens on demand
    copy = pickle.loads(pickle.dumps(first))
    assert copy.path == first.path and copy.experiment(exp).name == "e"


def test_open_without_create(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LocalStore(tmp_path / "missing", create=False)
    with pytest.raises(FileNotFoundError, match="has no store"):
        LocalStore(tmp_path, create=False)
    assert not (tmp_path / "store.sqlite").exists()
    LocalStore(tmp_path)
    LocalStore(tmp_path, create=False).experiments()


def test_not_a_store_and_newer_schema(tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "store.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(RuntimeError, match="not a usable store"):
        LocalStore(tmp_path / "bad")
    LocalStore(tmp_path / "new")
    conn = sqlite3.connect(tmp_path / "new" / "store.sqlite")
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(RuntimeError, match="newer determined_trials"):
        LocalStore(tmp_path / "new")


# -- experiments ---------------------------------------------------------------------------------
def test_experiment_round_trip(store: LocalStore) -> None:
    exp_id = store.create_experiment(
        name="mnist", config=_CONFIG, description="d", labels=["x", "y"], model_dir="/models/m"
    )
    exp = store.experiment(exp_id)
    assert (exp.id, exp.name, exp.description, exp.labels, exp.model_dir) == (
        exp_id, "mnist", "d", ("x", "y"), "/models/m"
    )
    assert exp.config == _CONFIG
    assert (exp.state, exp.reason, exp.searcher_state, exp.end_time) == ("ACTIVE", None, None, None)
    assert exp.start_time.tzinfo is not None and abs(exp.start_time.timestamp() - time.time()) < 60
    with pytest.raises(dataclasses.FrozenInstanceError):
        exp.name = "other"  # type: ignore[misc]
    second = store.create_experiment(name="b", config={})
    assert [e.id for e in store.experiments()] == [exp_id, second]


def test_experiment_states(store: LocalStore) -> None:
    exp_id = store.create_experiment(name="e", config={})
    store.set_experiment_state(exp_id, "paused", reason="user")
    exp = store.experiment(exp_id)
    assert (exp.state, exp.reason, exp.end_time) == ("PAUSED", "user", None)
    store.set_experiment_state(exp_id, "ERROR", reason="boom")
    exp = store.experiment(exp_id)
    assert (exp.state, exp.reason) == ("ERROR", "boom") and exp.end_time is not None
    store.set_experiment_state(exp_id, "ACTIVE")
    assert store.experiment(exp_id).end_time is None
    for state in ("COMPLETED", "CANCELED"):
        store.set_experiment_state(exp_id, state)
        assert store.experiment(exp_id).state == state
    with pytest.raises(ValueError, match="unknown experiment state 'DONE'; use one of ACTIVE"):
        store.set_experiment_state(exp_id, "DONE")


def test_searcher_state_round_trip(store: LocalStore) -> None:
    exp_id = store.create_experiment(name="e", config={})
    assert store.get_searcher_state(exp_id) is None
    state = {"ops": [{"trial": 1, "length": 100}], "rng": [1, 2, 3], "done": False}
    store.set_searcher_state(exp_id, state)
    assert store.get_searcher_state(exp_id) == state
    assert store.experiment(exp_id).searcher_state == state


# -- trials --------------------------------------------------------------------------------------
def test_trial_round_trip(store: LocalStore) -> None:
    exp_id = store.create_experiment(name="e", config={})
    other = store.create_experiment(name="o", config={})
    hparams = {"lr": 0.1, "model": {"layers": [64, 32], "act": "relu"}}
    t1 = store.create_trial(experiment_id=exp_id, hparams=hparams, seed=42)
    t2 = store.create_trial(experiment_id=other, hparams={}, seed=1)
    t3 = store.create_trial(experiment_id=exp_id, hparams={}, seed=2)
    trial = store.trial(t1)
    assert (trial.experiment_id, trial.hparams, trial.seed, trial.state) == (exp_id, hparams, 42, "ACTIVE")
    assert (trial.status, trial.metadata, trial.progress, trial.early_exit_reason, trial.restarts) == (
        None, {}, None, None, 0
    )
    assert [t.id for t in store.trials()] == [t1, t2, t3]
    assert [t.id for t in store.trials(exp_id)] == [t1, t3]


def test_trial_updates(store: LocalStore, trial_id: int) -> None:
    store.set_trial_status(trial_id, "training epoch 3")
    store.set_trial_metadata(trial_id, {"a": {"b": [1, 2]}})
    store.set_trial_metadata(trial_id, {"c": 1})  # replaces
    store.set_trial_progress(trial_id, 0.25)
    store.set_trial_early_exit(trial_id, "INVALID_HP")
    assert store.increment_trial_restarts(trial_id) == 1
    assert store.increment_trial_restarts(trial_id) == 2
    assert store.trial(trial_id).status == "training epoch 3"
    store.set_trial_state(trial_id, "ERROR", reason="crashed")
    trial = store.trial(trial_id)
    assert (trial.status, trial.metadata, trial.progress) == ("error", {"c": 1}, 0.25)
    assert (trial.early_exit_reason, trial.restarts, trial.state, trial.reason) == (
        "INVALID_HP", 2, "ERROR", "crashed"
    )
    assert trial.end_time is not None
    assert store.get_trial_metadata(trial_id) == {"c": 1}
    store.set_trial_state(trial_id, "ACTIVE")
    assert store.trial(trial_id).end_time is None


@pytest.mark.parametrize("end", ["COMPLETED", "PAUSED", "CANCELED"])
def test_a_trial_s_status_shows_its_end_and_a_late_status_write_does_not_undo_it(
    store: LocalStore, trial_id: int, end: str
) -> None:
    store.set_trial_status(trial_id, "training")
    store.set_trial_state(trial_id, end)
    store.set_trial_status(trial_id, "training")  # a held status stored at close, after the end
    assert store.trial(trial_id).status == end.lower()
    store.set_trial_state(trial_id, "ACTIVE")  # a restart: no status until the trial sets one
    assert store.trial(trial_id).status is None
    store.set_trial_status(trial_id, "validating")
    assert store.trial(trial_id).status == "validating"
    with pytest.raises(NotFoundError):
        store.set_trial_status(trial_id + 1000, "training")


def test_trial_update_validation(store: LocalStore, trial_id: int) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        store.set_trial_progress(trial_id, 1.5)
    with pytest.raises(TypeError, match="must be a dict"):
        store.set_trial_metadata(trial_id, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown trial state"):
        store.set_trial_state(trial_id, "RUNNING_FAST")
    with pytest.raises(TypeError, match="cannot store trial metadata: object is not JSON"):
        store.set_trial_metadata(trial_id, {"x": object()})


def test_searcher_ops(store: LocalStore, trial_id: int) -> None:
    store.record_searcher_op(trial_id, 100, None, False)
    store.record_searcher_op(trial_id, 100, 0.25, True)
    ops = store.searcher_ops(trial_id)
    assert [(o.length, o.metric, o.completed) for o in ops] == [(100, None, False), (100, 0.25, True)]
    assert ops[0].id < ops[1].id and ops[0].trial_id == trial_id


# -- metrics -------------------------------------------------------------------------------------
def test_metrics_json_round_trip(store: LocalStore, trial_id: int) -> None:
    nested = {
        "loss": 0.5,
        "nan": float("nan"),
        "inf": float("inf"),
        "ninf": float("-inf"),
        "confusion": [[1, 2], [3, 4]],
        "per_class": {"cat": {"precision": 0.9, "recall": None}},
        "name": "text",
        "flag": True,
    }
    batches = [{"loss": 0.6}, {"loss": float("nan")}]
    store.add_metrics(trial_id=trial_id, group="training", steps_completed=10, metrics=nested,
                      batch_metrics=batches)
    (record,) = store.metrics(trial_id)
    assert (record.trial_id, record.group, record.steps_completed) == (trial_id, "training", 10)
    got = record.metrics
    assert math.isnan(got["nan"]) and got["inf"] == math.inf and got["ninf"] == -math.inf
    assert {k: v for k, v in got.items() if k != "nan"} == {k: v for k, v in nested.items() if k != "nan"}
    assert record.batch_metrics is not None and record.batch_metrics[0] == {"loss": 0.6}
    assert math.isnan(record.batch_metrics[1]["loss"])
    assert record.reported_time.tzinfo is not None


def test_metrics_numpy_scalars(store: LocalStore, trial_id: int) -> None:
    np = pytest.importorskip("numpy")
    store.add_metrics(trial_id=trial_id, group="training", steps_completed=1,
                      metrics={"a": np.float32(0.5), "b": np.int64(3)})
    assert store.metrics(trial_id)[0].metrics == {"a": 0.5, "b": 3}


def test_metrics_order_and_groups(store: LocalStore, trial_id: int) -> None:
    def add(group: str, steps: int, value: float) -> None:
        store.add_metrics(trial_id=trial_id, group=group, steps_completed=steps, metrics={"v": value})

    add("training", 20, 1)
    add("validation", 10, 2)
    add("training", 10, 3)
    add("validation", 20, 4)
    add("training", 10, 5)  # same step reported again: after the earlier one
    assert [(r.group, r.steps_completed, r.metrics["v"]) for r in store.metrics(trial_id)] == [
        ("validation", 10, 2), ("training", 10, 3), ("training", 10, 5), ("training", 20, 1),
        ("validation", 20, 4),
    ]
    assert [r.metrics["v"] for r in store.metrics(trial_id, "training")] == [3, 5, 1]
    assert [r.metrics["v"] for r in store.metrics(trial_id, group="validation")] == [2, 4]
    assert store.metrics(trial_id, "profiling") == []
    assert store.metric_groups(trial_id) == ["training", "validation"]


def test_metrics_validation(store: LocalStore, trial_id: int) -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        store.add_metrics(trial_id=trial_id, group="training", steps_completed=-1, metrics={})
    with pytest.raises(ValueError, match="non-negative integer"):
        store.add_metrics(trial_id=trial_id, group="training", steps_completed=1.5, metrics={})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty string"):
        store.add_metrics(trial_id=trial_id, group="", steps_completed=1, metrics={})
    with pytest.raises(TypeError, match="cannot store validation metrics"):
        store.add_metrics(trial_id=trial_id, group="validation", steps_completed=1, metrics={"x": object()})
    assert store.metrics(trial_id) == []


def test_best_validation(store: LocalStore) -> None:
    exp_id = store.create_experiment(name="e", config={})
    other = store.create_experiment(name="o", config={})
    t1 = store.create_trial(experiment_id=exp_id, hparams={}, seed=1)
    t2 = store.create_trial(experiment_id=exp_id, hparams={}, seed=2)
    t3 = store.create_trial(experiment_id=other, hparams={}, seed=3)
    assert store.best_validation(exp_id, "loss", True) is None
    reports: list[tuple[int, str, dict[str, Any]]] = [
        (t1, "validation", {"loss": 0.5, "acc": 0.7}),
        (t1, "validation", {"loss": float("nan")}),
        (t2, "validation", {"loss": 0.3, "acc": 0.6}),
        (t2, "validation", {"acc": 0.9}),
        (t2, "validation", {"loss": "n/a"}),
        (t1, "training", {"loss": 0.01, "acc": 0.99}),
        (t3, "validation", {"loss": 0.001, "acc": 1.0}),
    ]
    for steps, (trial, group, metrics) in enumerate(reports):
        store.add_metrics(trial_id=trial, group=group, steps_completed=steps, metrics=metrics)
    assert store.best_validation(exp_id, "loss", smaller_is_better=True) == 0.3
    assert store.best_validation(exp_id, "loss", smaller_is_better=False) == 0.5
    assert store.best_validation(exp_id, "acc", smaller_is_better=False) == 0.9
    assert store.best_validation(exp_id, "acc", smaller_is_better=True) == 0.6
    assert store.best_validation(exp_id, "missing", True) is None


# -- checkpoints ---------------------------------------------------------------------------------
def _add_ckpt(store: LocalStore, uuid: str, trial: int | None, steps: int) -> None:
    store.add_checkpoint(uuid=uuid, trial_id=trial, steps_completed=steps,
                         metadata={"steps_completed": steps, "framework": "torch", "nested": {"a": [1]}},
                         resources={"model.pt": 1000, "sub/opt.pt": 24, "metadata.json": 0},
                         storage="/ckpts")


def test_checkpoints(store: LocalStore, trial_id: int) -> None:
    exp2 = store.create_experiment(name="o", config={})
    t2 = store.create_trial(experiment_id=exp2, hparams={}, seed=0)
    _add_ckpt(store, "c-1", trial_id, 10)
    _add_ckpt(store, "c-2", t2, 5)
    _add_ckpt(store, "c-3", trial_id, 20)
    _add_ckpt(store, "c-free", None, 0)
    ckpt = store.checkpoint("c-1")
    assert (ckpt.trial_id, ckpt.experiment_id, ckpt.steps_completed, ckpt.state, ckpt.storage) == (
        trial_id, store.trial(trial_id).experiment_id, 10, "COMPLETED", "/ckpts"
    )
    assert ckpt.metadata == {"steps_completed": 10, "framework": "torch", "nested": {"a": [1]}}
    assert ckpt.resources == {"model.pt": 1000, "sub/opt.pt": 24, "metadata.json": 0}
    assert ckpt.size == 1024 and ckpt.delete_time is None
    assert store.checkpoint("c-free").experiment_id is None
    assert [c.uuid for c in store.checkpoints()] == ["c-1", "c-2", "c-3", "c-free"]
    assert [c.uuid for c in store.checkpoints(trial_id=trial_id)] == ["c-1", "c-3"]
    assert [c.uuid for c in store.checkpoints(experiment_id=exp2)] == ["c-2"]
    latest = store.latest_checkpoint(trial_id)
    assert latest is not None and latest.uuid == "c-3"
    with pytest.raises(ValueError, match="c-1 is already recorded"):
        _add_ckpt(store, "c-1", trial_id, 30)


def test_checkpoint_deletion(store: LocalStore, trial_id: int) -> None:
    _add_ckpt(store, "a", trial_id, 1)
    _add_ckpt(store, "b", trial_id, 2)
    store.mark_checkpoint_deleted("b")
    deleted = store.checkpoint("b")
    assert deleted.state == "DELETED" and deleted.delete_time is not None
    store.mark_checkpoint_deleted("b")  # twice is harmless and keeps the first time
    assert store.checkpoint("b").delete_time == deleted.delete_time
    assert [c.uuid for c in store.checkpoints(trial_id=trial_id)] == ["a"]
    assert [c.uuid for c in store.checkpoints(include_deleted=True)] == ["a", "b"]
    latest = store.latest_checkpoint(trial_id)
    assert latest is not None and latest.uuid == "a"


# -- missing ids ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, what",
    [
        (lambda s: s.experiment(99), "experiment 99"),
        (lambda s: s.trials(99), "experiment 99"),
        (lambda s: s.set_experiment_state(99, "PAUSED"), "experiment 99"),
        (lambda s: s.set_searcher_state(99, {}), "experiment 99"),
        (lambda s: s.get_searcher_state(99), "experiment 99"),
        (lambda s: s.best_validation(99, "loss", True), "experiment 99"),
        (lambda s: s.create_trial(experiment_id=99, hparams={}, seed=0), "experiment 99"),
        (lambda s: s.trial(99), "trial 99"),
        (lambda s: s.set_trial_state(99, "PAUSED"), "trial 99"),
        (lambda s: s.set_trial_status(99, "x"), "trial 99"),
        (lambda s: s.set_trial_metadata(99, {}), "trial 99"),
        (lambda s: s.get_trial_metadata(99), "trial 99"),
        (lambda s: s.set_trial_progress(99, 0.5), "trial 99"),
        (lambda s: s.set_trial_early_exit(99, "INVALID_HP"), "trial 99"),
        (lambda s: s.increment_trial_restarts(99), "trial 99"),
        (lambda s: s.record_searcher_op(99, 1, None, False), "trial 99"),
        (lambda s: s.searcher_ops(99), "trial 99"),
        (lambda s: s.add_metrics(trial_id=99, group="g", steps_completed=0, metrics={}), "trial 99"),
        (lambda s: s.metrics(99), "trial 99"),
        (lambda s: s.checkpoints(trial_id=99), "trial 99"),
        (lambda s: s.checkpoints(experiment_id=99), "experiment 99"),
        (lambda s: _add_ckpt(s, "u", 99, 0), "trial 99"),
        (lambda s: s.checkpoint("nope"), "checkpoint 'nope'"),
        (lambda s: s.mark_checkpoint_deleted("nope"), "checkpoint 'nope'"),
    ],
)
def test_missing_ids(store: LocalStore, call: Any, what: str) -> None:
    with pytest.raises(NotFoundError) as info:
        call(store)
    assert isinstance(info.value, KeyError)
    message = str(info.value)
    assert message.startswith(f"{what} not found") and str(store.db_path) in message


def test_set_experiment_model_dir(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    exp = store.create_experiment(name="x", config={})
    store.set_experiment_model_dir(exp, "/somewhere/model")
    assert store.experiment(exp).model_dir == "/somewhere/model"
    with pytest.raises(KeyError):
        store.set_experiment_model_dir(999, "/nope")
