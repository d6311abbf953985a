"""core.init() in a bare script: the trial it registers, what lands in the store and TensorBoard,
early exits, final states, cluster info, and that everything started is stopped on exit."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest

import determined_trials as det
from determined_trials import ClusterInfo, TrialInfo
from determined_trials._info import CLUSTER_INFO_ENV

CONFIG = {
    "name": "unit",
    "hyperparameters": {"lr": {"type": "double", "minval": 0.1, "maxval": 0.2}, "layers": 3},
    "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 40}},
    "reproducibility": {"experiment_seed": 7},
}


def _read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_bare_script_registers_a_trial_with_seeded_hparams(tmp_path: Path) -> None:
    assert det.get_cluster_info() is None
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        trial = ctx.info.trial
        assert trial.trial_seed == 7 and trial.hparams["layers"] == 3
        assert 0.1 <= trial.hparams["lr"] <= 0.2
        lengths = []
        for op in ctx.searcher.operations():
            lengths.append(op.length)
            op.report_completed(1.0)
        assert lengths == [40]
        assert ctx.searcher.get_configured_units() is det.core.Unit.BATCHES
    store = det.core.LocalStore(tmp_path)
    assert store.trial(trial.trial_id).hparams == trial.hparams
    assert store.experiment(trial.experiment_id).name == "unit"
    assert store.trial(trial.trial_id).state == "COMPLETED"
    with det.core.init(config=CONFIG, run_dir=tmp_path) as again:
        assert again.info.trial.hparams == trial.hparams  # same seed, same sample


def test_metrics_land_in_the_store_and_tensorboard(tmp_path: Path) -> None:
    import numpy as np
    import torch

    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        ctx.train.report_training_metrics(10, {"loss": torch.tensor(0.5)}, batch_metrics=[{"loss": 0.6}, {"loss": 0.4}])
        ctx.train.report_training_metrics(20, {"loss": np.float32(0.25)})
        ctx.train.report_validation_metrics(20, {"val_loss": 0.3, "accuracy": 0.9})
        ctx.train.report_metrics("custom", 20, {"thing": 3})
        tb_path = ctx.train.get_tensorboard_path()
        trial_id = ctx.info.trial.trial_id
        with pytest.raises(ValueError, match="already reported"):
            ctx.train.report_validation_metrics(20, {"accuracy": 0.8})
        with pytest.raises(ValueError, match="contains '.'"):
            ctx.train.report_metrics("a.b", 1, {"x": 1})
        with pytest.raises(TypeError, match="'weights'"):
            ctx.train.report_training_metrics(30, {"weights": torch.ones(3)})
    store = det.core.LocalStore(tmp_path)
    training = store.metrics(trial_id, group="training")
    assert [(m.steps_completed, m.metrics) for m in training] == [(10, {"loss": 0.5}), (20, {"loss": 0.25})]
    assert training[0].batch_metrics == [{"loss": 0.6}, {"loss": 0.4}]
    assert store.metrics(trial_id, group="validation")[0].metrics == {"val_loss": 0.3, "accuracy": 0.9}
    assert store.metrics(trial_id, group="custom")[0].metrics == {"thing": 3}
    scalars = _read_scalars(tb_path)
    assert scalars["loss"] == [(10, 0.5), (20, 0.25)]
    assert scalars["val_loss"] == [(20, pytest.approx(0.3))]
    assert scalars["val_accuracy"] == [(20, pytest.approx(0.9))]
    assert scalars["custom/thing"] == [(20, 3.0)]


def test_manual_tensorboard_mode_writes_nothing(tmp_path: Path) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path, tensorboard_mode=det.core.TensorboardMode.MANUAL) as ctx:
        ctx.train.report_training_metrics(1, {"loss": 1.0})
        tb_path = ctx.train.get_tensorboard_path()
    assert list(tb_path.iterdir()) == []


def test_status_metadata_progress_and_best_validation(tmp_path: Path) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        assert ctx.train.get_experiment_best_validation() is None
        ctx.train.set_status("warming up")
        assert ctx.train.set_metadata({"note": "x", "n": 2}) == {"note": "x", "n": 2}
        assert ctx.train.get_metadata() == {"note": "x", "n": 2}
        ctx.train.report_progress(0.5)
        with pytest.raises(ValueError, match="between 0 and 1"):
            ctx.train.report_progress(2)
        ctx.train.report_validation_metrics(1, {"val_loss": 0.7})
        ctx.train.report_validation_metrics(2, {"val_loss": 0.4})
        ctx.train.report_validation_metrics(3, {"val_loss": 0.5})
        assert ctx.train.get_experiment_best_validation() == pytest.approx(0.4)
        trial_id = ctx.info.trial.trial_id
        assert det.core.LocalStore(tmp_path).trial(trial_id).status == "warming up"
    trial = det.core.LocalStore(tmp_path).trial(trial_id)
    assert trial.status == "completed" and trial.progress == pytest.approx(0.5)  # the status shows the end


def test_invalid_hp_reports_early_exit_and_is_swallowed(tmp_path: Path) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        trial_id = ctx.info.trial.trial_id
        raise det.InvalidHP("lr too large")
    trial = det.core.LocalStore(tmp_path).trial(trial_id)
    assert trial.early_exit_reason == "INVALID_HP"
    assert trial.state == "COMPLETED"


def test_an_exception_marks_the_trial_failed_and_still_cleans_up(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ZeroDivisionError):
        with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
            ctx.profiler.on(sampling_interval=0.05, samples_per_report=2)
            assert signal.getsignal(signal.SIGTERM) != before
            trial_id = ctx.info.trial.trial_id
            1 / 0
    assert signal.getsignal(signal.SIGTERM) == before
    assert not ctx.profiler.is_on
    assert not any(t.name == "det-profiler" for t in threading.enumerate())
    trial = det.core.LocalStore(tmp_path).trial(trial_id)
    assert trial.state == "ERROR" and "ZeroDivisionError" in (trial.reason or "")


def test_profiler_reports_system_metrics(tmp_path: Path) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        ctx.profiler.on(sampling_interval=0.02, samples_per_report=3)
        ctx.profiler.on()  # idempotent
        threading.Event().wait(0.3)
        ctx.profiler.off()
        ctx.profiler.off()
        trial_id = ctx.info.trial.trial_id
    rows = det.core.LocalStore(tmp_path).metrics(trial_id, group="system")
    assert len(rows) >= 2
    sample = rows[0].metrics
    for key in ("cpu_util_percent", "memory_used_gb", "disk_read_mb_per_s", "net_recv_mb_per_s"):
        assert key in sample
    assert 0.0 <= sample["cpu_util_percent"] <= 100.0 * 64
    assert [r.steps_completed for r in rows] == list(range(len(rows)))


def test_sigterm_preempts_and_the_trial_is_paused(tmp_path: Path) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        assert ctx.preempt.should_preempt() is False
        signal.raise_signal(signal.SIGTERM)
        assert ctx.preempt.should_preempt() is True
        assert ctx.preempt.acknowledged
        trial_id = ctx.info.trial.trial_id
    assert det.core.LocalStore(tmp_path).trial(trial_id).state == "PAUSED"


def test_sigusr1_and_programmatic_requests_preempt(tmp_path: Path) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        signal.raise_signal(signal.SIGUSR1)
        assert ctx.preempt.should_preempt(auto_ack=False) is True
        assert not ctx.preempt.acknowledged
        ctx.preempt.acknowledge_preemption_signal()
        assert ctx.preempt.acknowledged
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        ctx.preempt.request_preemption()
        assert ctx.preempt.should_preempt()


def test_should_preempt_outside_the_with_block_is_an_error(tmp_path: Path) -> None:
    ctx = det.core.init(config=CONFIG, run_dir=tmp_path)
    with pytest.raises(RuntimeError, match="not started"):
        ctx.preempt.should_preempt()
    ctx.close()


def test_checkpoints_are_recorded_in_the_store(tmp_path: Path) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        with ctx.checkpoint.store_path({"steps_completed": 5, "note": "a"}) as (path, uuid):
            (path / "weights.bin").write_bytes(b"12345")
        trial_id = ctx.info.trial.trial_id
        assert ctx.checkpoint.get_metadata(uuid)["note"] == "a"
    record = det.core.LocalStore(tmp_path).checkpoint(uuid)
    assert record.trial_id == trial_id and record.steps_completed == 5
    assert record.resources["weights.bin"] == 5
    assert (tmp_path / "checkpoints" / uuid / "weights.bin").read_bytes() == b"12345"


def test_cluster_info_from_a_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = det.core.LocalStore(tmp_path)
    exp_id = store.create_experiment(name="launched", config=CONFIG)
    trial_id = store.create_trial(experiment_id=exp_id, hparams={"lr": 0.15, "layers": 3}, seed=11)
    info = ClusterInfo(
        trial=TrialInfo(trial_id=trial_id, experiment_id=exp_id, trial_seed=11,
                        hparams={"lr": 0.15, "layers": 3}, config=CONFIG, steps_completed=20),
        run_dir=str(tmp_path), latest_checkpoint="abc",
    )
    path = info.write(tmp_path / "info.json")
    monkeypatch.setenv(CLUSTER_INFO_ENV, str(path))
    got = det.get_cluster_info()
    assert got == info and json.loads(path.read_text())["trial"]["trial_seed"] == 11
    with det.core.init() as ctx:
        assert ctx.info.trial.trial_id == trial_id and ctx.info.latest_checkpoint == "abc"
        ctx.train.report_training_metrics(21, {"loss": 1.0})
    assert det.core.LocalStore(tmp_path).metrics(trial_id)[0].steps_completed == 21


def test_missing_cluster_info_file_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CLUSTER_INFO_ENV, str(tmp_path / "nope.json"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        det.get_cluster_info()


def test_run_dir_default_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from determined_trials.core._context import resolve_run_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DET_RUN_DIR", raising=False)
    assert resolve_run_dir() == tmp_path / "det-runs"
    monkeypatch.setenv("DET_RUN_DIR", str(tmp_path / "elsewhere"))
    assert resolve_run_dir() == tmp_path / "elsewhere"


def test_a_preempted_script_leaves_the_launcher_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launch_dir = tmp_path / "launch"
    launch_dir.mkdir()
    monkeypatch.setenv("DET_LAUNCH_DIR", str(launch_dir))
    with det.core.init(config=CONFIG, run_dir=tmp_path / "run") as ctx:
        assert not ctx.preempt.should_preempt()
    assert not (launch_dir / "preempted").exists()
    with det.core.init(config=CONFIG, run_dir=tmp_path / "run") as ctx:
        ctx.preempt.request_preemption()
        assert ctx.preempt.should_preempt()
    assert (launch_dir / "preempted").exists()
