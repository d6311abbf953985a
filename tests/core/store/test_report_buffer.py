"""Issue 12: reports off the training path without losing them. Reports (training and validation)
less than a second apart are stored together (one transaction), in the order they were made, always
before a checkpoint record, a read of the experiment's best validation, a completed searcher
operation, or exit; progress and status are stored at most once a second and at close; TensorBoard
events are flushed at most once a second (and when asked). The clock is faked: no sleeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trials_pytorch import LinearTrial, config

import determined_trials as det
from determined_trials import pytorch
from determined_trials.core.store import _report_buffer

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)

CONFIG = {
    "name": "buffer",
    "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 40}},
    "reproducibility": {"experiment_seed": 3},
}


class _Clock:
    """A monotonic/time() stand-in that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(_report_buffer, "time", fake)
    return fake


@pytest.fixture
def stored_at_completion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The validation steps in the store each time a searcher operation is recorded completed."""
    seen: list[list[int]] = []
    record = det.core.LocalStore.record_searcher_op

    def recording(self: det.core.LocalStore, trial_id: int, length: int, metric: Any, completed: bool) -> None:
        if completed:
            seen.append(_stored(tmp_path, trial_id, "validation"))  # what the store holds at that moment
        record(self, trial_id, length, metric, completed)

    monkeypatch.setattr(det.core.LocalStore, "record_searcher_op", recording)
    return seen


def _stored(run_dir: Path, trial_id: int, group: str = "training") -> list[int]:
    return [m.steps_completed for m in det.core.LocalStore(run_dir).metrics(trial_id, group=group)]


def test_training_reports_within_a_second_are_stored_together_a_second_later(tmp_path: Path, clock: _Clock) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        trial_id = ctx.info.trial.trial_id
        ctx.train.report_training_metrics(1, {"loss": 1.0})  # the first is stored at once
        clock.now += 0.3
        ctx.train.report_training_metrics(2, {"loss": 0.9})
        clock.now += 0.3
        ctx.train.report_training_metrics(3, {"loss": 0.8})
        assert _stored(tmp_path, trial_id) == [1]  # 2 and 3 are held
        clock.now += 0.5  # a second after the last store: the next report stores all held ones
        ctx.train.report_training_metrics(4, {"loss": 0.7})
        assert _stored(tmp_path, trial_id) == [1, 2, 3, 4]
        clock.now += 0.1
        ctx.train.report_training_metrics(5, {"loss": 0.6})
        assert _stored(tmp_path, trial_id) == [1, 2, 3, 4]
    assert _stored(tmp_path, trial_id) == [1, 2, 3, 4, 5]  # close stores what is held
    rows = det.core.LocalStore(tmp_path).metrics(trial_id, group="training")
    assert [r.metrics["loss"] for r in rows] == [1.0, 0.9, 0.8, 0.7, 0.6]
    times = [r.reported_time.timestamp() for r in rows]
    assert times == sorted(times)  # each keeps the time it was reported


def test_validation_reports_are_held_in_order_and_checkpoints_store_them_first(tmp_path: Path, clock: _Clock) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        trial_id = ctx.info.trial.trial_id
        ctx.train.report_training_metrics(1, {"loss": 1.0})  # the first is stored at once
        ctx.train.report_training_metrics(2, {"loss": 0.9})
        ctx.train.report_validation_metrics(2, {"val_loss": 0.5})
        assert _stored(tmp_path, trial_id) == [1] and _stored(tmp_path, trial_id, "validation") == []  # held
        ctx.train.report_training_metrics(3, {"loss": 0.8})
        with ctx.checkpoint.store_path({"steps_completed": 3}) as (path, _):
            (path / "weights").write_text("w")
            # stored before the (pending) checkpoint row, in the order they were reported
            assert _stored(tmp_path, trial_id) == [1, 2, 3]
            assert _stored(tmp_path, trial_id, "validation") == [2]
        ids = {(m.group, m.steps_completed): m.id for m in det.core.LocalStore(tmp_path).metrics(trial_id)}
        assert ids[("training", 2)] < ids[("validation", 2)] < ids[("training", 3)]
        assert [c.steps_completed for c in det.core.LocalStore(tmp_path).checkpoints(trial_id=trial_id)] == [3]


def test_reading_the_best_validation_counts_the_held_ones(tmp_path: Path, clock: _Clock) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        ctx.train.report_training_metrics(1, {"loss": 1.0})
        ctx.train.report_validation_metrics(1, {"val_loss": 0.5})
        ctx.train.report_validation_metrics(2, {"val_loss": 0.25})  # held
        assert ctx.train.get_experiment_best_validation() == 0.25


def test_a_core_api_operation_completed_after_a_held_validation_is_recorded_after_it(
        tmp_path: Path, clock: _Clock, stored_at_completion: list[list[int]]) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        for op in ctx.searcher.operations():
            ctx.train.report_validation_metrics(1, {"val_loss": 0.5})
            ctx.train.report_validation_metrics(op.length, {"val_loss": 0.25})  # held: less than a second later
            op.report_completed(0.25)
    assert stored_at_completion == [[1, 40]]


def test_an_error_in_the_with_block_still_stores_held_reports(tmp_path: Path, clock: _Clock) -> None:
    with pytest.raises(RuntimeError, match="boom"), det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        trial_id = ctx.info.trial.trial_id
        ctx.train.report_training_metrics(1, {"loss": 1.0})
        ctx.train.report_training_metrics(2, {"loss": 0.9})
        raise RuntimeError("boom")
    assert _stored(tmp_path, trial_id) == [1, 2]


def test_status_and_progress_are_stored_within_a_second_and_at_close(tmp_path: Path, clock: _Clock) -> None:
    with det.core.init(config=CONFIG, run_dir=tmp_path) as ctx:
        trial_id = ctx.info.trial.trial_id
        ctx.train.set_status("warming up")  # the first write is at once
        ctx.train.set_status("training")
        ctx.train.report_progress(0.25)
        stored = det.core.LocalStore(tmp_path).trial(trial_id)
        assert stored.status == "warming up" and not stored.progress
        clock.now += 1.0
        ctx.train.report_progress(0.5)  # a second later: everything held is written
        stored = det.core.LocalStore(tmp_path).trial(trial_id)
        assert stored.status == "training" and stored.progress == 0.5
        ctx.train.set_status("validating")
        ctx.train.report_progress(1.0)  # the end is written at once
        assert det.core.LocalStore(tmp_path).trial(trial_id).progress == 1.0
        ctx.train.set_status("checkpointing")
        assert det.core.LocalStore(tmp_path).trial(trial_id).status == "validating"  # "checkpointing" is held
        ctx.train.close()  # what close stores (the held status) ...
        assert det.core.LocalStore(tmp_path).trial(trial_id).status == "checkpointing"
    assert det.core.LocalStore(tmp_path).trial(trial_id).status == "completed"  # ... until the trial's end


def test_fit_leaves_every_report_in_the_store_when_it_returns(tmp_path: Path, clock: _Clock) -> None:
    with pytorch.init(exp_conf=config({"global_batch_size": 1}), run_dir=tmp_path) as context:
        trial = LinearTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(8), reporting_period=pytorch.Batch(1),
                                            show_progress=False)
        assert _stored(tmp_path, context.get_trial_id()) == list(range(1, 9))


class _KilledTrial(LinearTrial):
    """Raises in the fifth batch, after four training reports (the clock never moves)."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        if batch_idx == 4:
            raise RuntimeError("batch 5 failed")
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_a_failing_fit_keeps_the_reports_made_before_the_failure(tmp_path: Path, clock: _Clock) -> None:
    with pytest.raises(RuntimeError, match="batch 5 failed"), \
            pytorch.init(exp_conf=config({"global_batch_size": 1}), run_dir=tmp_path) as context:
        trial_id = context.get_trial_id()
        pytorch.Trainer(_KilledTrial(context), context).fit(
            max_length=pytorch.Batch(8), reporting_period=pytorch.Batch(1), show_progress=False)
    assert _stored(tmp_path, trial_id) == [1, 2, 3, 4]
    assert torch.isfinite(torch.tensor(
        [m.metrics["loss"] for m in det.core.LocalStore(tmp_path).metrics(trial_id, group="training")])).all()


def test_a_completed_searcher_operation_is_recorded_after_the_validation_it_names(
        tmp_path: Path, clock: _Clock, stored_at_completion: list[list[int]]) -> None:
    with pytorch.init(exp_conf=config({"global_batch_size": 1}), run_dir=tmp_path) as context:
        trial = LinearTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=None, reporting_period=pytorch.Batch(2),
                                            checkpoint_policy="none", show_progress=False)
    assert stored_at_completion == [[8]]  # the searcher's one operation (8 batches) after its validation was stored
