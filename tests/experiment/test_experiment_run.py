"""`det-trials experiment create` end to end with real trial processes (a tiny Core API script):
grid, InvalidHP, restarts after a crash, max_restarts used up, checkpoint GC, ASHA promotions."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.helpers_experiment import create, final_states, make_context

from determined_trials.core import LocalStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.usefixtures("cpu_device")]


def test_grid_experiment_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, ctx = make_context(tmp_path, {"lr": {"type": "categorical", "vals": [0.1, 0.5, 0.9]}},
                               searcher={"name": "grid", "metric": "loss", "max_length": 4})
    run_dir = tmp_path / "runs"
    assert create(run_dir, config, ctx) == 0
    out = capsys.readouterr().out
    store = LocalStore(run_dir)
    exp = store.experiment(1)
    assert exp.state == "COMPLETED"
    assert exp.model_dir == str(run_dir / "experiments" / "1" / "model")
    assert (Path(exp.model_dir) / "trial.py").is_file()
    trials = store.trials(1)
    assert [t.hparams["lr"] for t in trials] == [0.1, 0.5, 0.9]
    assert all(t.state == "COMPLETED" for t in trials)
    assert [t.status for t in trials] == ["completed"] * 3  # not the "training" each set last
    assert "[trial 1] done at step 4" in out
    assert "Experiment 1: COMPLETED" in out
    for trial in trials:
        assert f"lr={trial.hparams['lr']:g}" in out
        assert [op.length for op in store.searcher_ops(trial.id) if op.completed] == [4]
        assert (run_dir / "experiments" / "1" / f"trial_{trial.id}.log").read_text().endswith("\n")
    # default GC: the best and the latest checkpoint of each trial
    for trial in trials:
        losses = {m.steps_completed: m.metrics["loss"] for m in store.metrics(trial.id, "validation")}
        expected = {4, min(losses, key=losses.__getitem__)}
        assert {c.steps_completed for c in store.checkpoints(trial_id=trial.id)} == expected
    assert len(store.checkpoints(experiment_id=1, include_deleted=True)) == 12
    for ckpt in store.checkpoints(experiment_id=1, include_deleted=True):
        assert (run_dir / "checkpoints" / ckpt.uuid).exists() == (ckpt.state == "COMPLETED")


def test_invalid_hp_ends_the_trial_not_the_experiment(tmp_path: Path) -> None:
    config, ctx = make_context(tmp_path, {"invalid": {"type": "categorical", "vals": [False, True]}},
                               searcher={"name": "grid", "metric": "loss", "max_length": 3})
    run_dir = tmp_path / "runs"
    assert create(run_dir, config, ctx) == 0
    store = LocalStore(run_dir)
    assert store.experiment(1).state == "COMPLETED"
    good, bad = store.trials(1)
    assert good.state == bad.state == "COMPLETED"
    assert bad.early_exit_reason == "INVALID_HP" and good.early_exit_reason is None
    assert store.checkpoints(trial_id=bad.id) == []


def test_crashed_trial_restarts_from_its_checkpoint_with_the_same_result(tmp_path: Path) -> None:
    crash_dir = tmp_path / "crashes"
    crash_dir.mkdir()
    clean_cfg, clean_ctx = make_context(tmp_path / "clean", {})
    config, ctx = make_context(tmp_path, {"crash_at": 4, "crash_times": 1, "crash_dir": str(crash_dir)})
    assert create(tmp_path / "clean-runs", clean_cfg, clean_ctx) == 0
    assert create(tmp_path / "runs", config, ctx) == 0
    store = LocalStore(tmp_path / "runs")
    trial = store.trial(1)
    assert (trial.state, trial.restarts) == ("COMPLETED", 1)
    log = (tmp_path / "runs" / "experiments" / "1" / "trial_1.log").read_text()
    assert "boom at step 4" in log and "resumed at step 3" in log
    assert final_states(store, 1) == final_states(LocalStore(tmp_path / "clean-runs"), 1)


def test_max_restarts_used_up_fails_the_experiment_with_the_reason(tmp_path: Path) -> None:
    crash_dir = tmp_path / "crashes"
    crash_dir.mkdir()
    config, ctx = make_context(tmp_path, {"crash_at": 2, "crash_times": 99, "crash_dir": str(crash_dir)},
                               max_restarts=1)
    assert create(tmp_path / "runs", config, ctx) == 1
    store = LocalStore(tmp_path / "runs")
    exp, trial = store.experiment(1), store.trial(1)
    assert exp.state == "ERROR" and trial.state == "ERROR"
    assert "max_restarts (1)" in (exp.reason or "") and "boom at step 2" in (exp.reason or "")
    assert "boom at step 2" in (trial.reason or "")
    assert trial.restarts == 1
    assert (crash_dir / "crashes_1").read_text() == "2"


def test_gc_keeps_the_best_and_latest_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config, ctx = make_context(
        tmp_path, {"curve": [5.0, 1.0, 4.0, 3.0, 2.0, 6.0]},
        checkpoint_storage={"type": "directory", "container_path": "ckpts", "save_trial_best": 2,
                            "save_trial_latest": 1},
    )
    run_dir = tmp_path / "runs"
    assert create(run_dir, config, ctx) == 0  # a relative storage path is taken from the working dir
    store = LocalStore(run_dir)
    kept = sorted(c.steps_completed for c in store.checkpoints(trial_id=1))
    assert kept == [2, 5, 6]
    assert store.experiment(1).config["checkpoint_storage"]["container_path"] == str(tmp_path / "ckpts")
    on_disk = {p.name for p in (tmp_path / "ckpts").iterdir()}
    assert on_disk == {c.uuid for c in store.checkpoints(trial_id=1)}


def test_asha_promotes_by_restarting_trials_from_their_checkpoints(tmp_path: Path) -> None:
    config, ctx = make_context(
        tmp_path, {"lr": {"type": "double", "minval": 0.05, "maxval": 0.9}},
        searcher={"name": "adaptive_asha", "metric": "loss", "max_length": 8, "max_trials": 4,
                  "divisor": 2, "max_rungs": 3, "mode": "aggressive", "max_concurrent_trials": 4},
    )
    run_dir = tmp_path / "runs"
    assert create(run_dir, config, ctx) == 0
    store = LocalStore(run_dir)
    lengths = {t.id: [op.length for op in store.searcher_ops(t.id) if op.completed] for t in store.trials(1)}
    assert len(lengths) == 4
    assert max(len(v) for v in lengths.values()) > 1  # someone was promoted...
    assert min(len(v) for v in lengths.values()) == 1  # ...and someone stopped at the first rung
    for trial_id, done in lengths.items():
        assert done == sorted(done)
        log = (run_dir / "experiments" / "1" / f"trial_{trial_id}.log").read_text()
        assert log.count("resumed at step") == len(done) - 1
