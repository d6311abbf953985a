"""Trainer.fit metrics: function reducers and MetricReducers in training and validation, the
evaluation_reducer dict form, evaluate_full_dataset, and training driven by the config's searcher."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trials_pytorch import LINEAR_XS, LinearTrial, ReducerTrial, ScriptedValidationTrial, config, fit

from determined_trials.pytorch import Batch, Epoch

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)


def _by_step(records: list[Any]) -> dict[int, dict[str, Any]]:
    return {r.steps_completed: r.metrics for r in records}


def test_reducers_in_training_and_validation(tmp_path: Path) -> None:
    """Batches of 2, unshuffled: workload 1 sees xs[0:4], workload 2 xs[4:8]; validation sees all."""
    trial, _, info = fit(ReducerTrial, config({"global_batch_size": 2}), tmp_path,
                         max_length=Batch(4), reporting_period=Batch(2), validation_period=Batch(4))
    training = _by_step(info["training"])
    assert sorted(training) == [2, 4]
    for step, xs in ((2, LINEAR_XS[0:4]), (4, LINEAR_XS[4:8])):
        metrics = training[step]
        assert metrics["xs_seen"] == pytest.approx(xs)  # the function got every update, in order, flattened
        assert metrics["sumsq"] == pytest.approx(sum(x * x for x in xs))  # MetricReducer, unnamed: its dict
        assert metrics["sumsq_count"] == 4
        batch_means = [(xs[0] + xs[1]) / 2, (xs[2] + xs[3]) / 2]
        assert metrics["x_mean"] == pytest.approx(sum(batch_means) / 2)  # train_batch dict: mean over batches
        assert metrics["loss"] == pytest.approx(sum(e["loss"] for e in trial.log[step - 2:step]) / 2, rel=1e-6)
    validation = _by_step(info["validation"])[4]
    assert validation["xs_seen"] == pytest.approx(LINEAR_XS)  # updates made in evaluate_batch only
    assert validation["sumsq"] == pytest.approx(sum(x * x for x in LINEAR_XS))
    assert validation["sumsq_count"] == 8
    # evaluation_reducer() dict: AVG (record-weighted), SUM, MAX, MIN over the two batches of 4
    sums = [sum(LINEAR_XS[0:4]), sum(LINEAR_XS[4:8])]
    assert validation["validation_loss"] == pytest.approx((sums[0] * 4 + sums[1] * 4) / 8)
    assert validation["x_sum"] == pytest.approx(sum(LINEAR_XS))
    assert validation["x_max"] == max(LINEAR_XS)
    assert validation["first_index"] == 0 and isinstance(validation["first_index"], int)  # integral under MIN
    # the callbacks see the same reduced values
    workload_metrics = [e[1] for e in trial.events if e[0] == "workload_end"]
    assert workload_metrics[0]["xs_seen"] == pytest.approx(LINEAR_XS[0:4])
    val_metrics = next(e[1] for e in trial.events if e[0] == "validation_end")
    assert val_metrics["x_sum"] == pytest.approx(sum(LINEAR_XS))


class _TrainingOnlyReducerTrial(LinearTrial):
    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.count = context.wrap_reducer(len, name="updates", for_validation=False)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.count.update(batch_idx)
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_reducer_for_training_only_is_not_reported_in_validation(tmp_path: Path) -> None:
    _, _, info = fit(_TrainingOnlyReducerTrial, config({"global_batch_size": 2}), tmp_path,
                     max_length=Batch(6), reporting_period=Batch(3))
    assert [m.metrics["updates"] for m in info["training"]] == [3, 3]
    assert "updates" not in info["validation"][-1].metrics


class _BadReducerTrial(LinearTrial):
    def __init__(self, context: Any, *, named: bool) -> None:
        super().__init__(context)
        if named:
            self.red = context.wrap_reducer(lambda values: {"a": 1}, name="oops")
        else:
            self.red = context.wrap_reducer(lambda values: 1.0)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.red.update(1)
        return super().train_batch(batch, epoch_idx, batch_idx)


@pytest.mark.parametrize(("named", "message"), [(True, "returned a dict"), (False, "not a dict")])
def test_reducer_result_shape_errors(tmp_path: Path, named: bool, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        fit(lambda ctx: _BadReducerTrial(ctx, named=named), config(), tmp_path, max_length=Batch(2))


def test_evaluate_full_dataset_path(tmp_path: Path) -> None:
    trial, _, info = fit(lambda ctx: ScriptedValidationTrial(ctx, values=[0.7, 0.2]), config(), tmp_path,
                         max_length=Batch(4), validation_period=Batch(2))
    assert [(m.steps_completed, m.metrics["validation_loss"]) for m in info["validation"]] == [(2, 0.7), (4, 0.2)]
    assert all(m.metrics["records"] == len(LINEAR_XS) for m in info["validation"])  # the whole, unsharded set
    assert trial.validations == 2


@pytest.mark.parametrize(
    ("max_length", "batches"),
    [({"batches": 6}, 6), ({"epochs": 2}, 8), ({"records": 8}, 4), (5, 5)],
)
def test_searcher_drives_training_when_max_length_is_none(tmp_path: Path, max_length: Any, batches: int) -> None:
    conf = config({"global_batch_size": 2})  # 4 batches per epoch
    conf["searcher"]["max_length"] = max_length
    trial, _, info = fit(LinearTrial, conf, tmp_path, max_length=None)
    assert len(trial.log) == batches
    assert [m.steps_completed for m in info["validation"]] == [batches]
    final = info["validation"][-1].metrics["validation_loss"]
    ops = info["searcher_ops"]
    assert [(op.completed, op.length) for op in ops if op.completed] == [
        (True, max_length if isinstance(max_length, int) else next(iter(max_length.values())))
    ]
    assert ops[-1].metric == pytest.approx(final)  # the searcher metric is reported
    assert [c.steps_completed for c in info["checkpoints"]][-1] == batches


def test_searcher_metric_missing_is_a_clear_error(tmp_path: Path) -> None:
    conf = config()
    conf["searcher"]["metric"] = "accuracy"
    with pytest.raises(KeyError, match="accuracy"):
        fit(LinearTrial, conf, tmp_path, max_length=None)


def test_max_length_in_epochs_and_records(tmp_path: Path) -> None:
    trial, _, _ = fit(LinearTrial, config({"global_batch_size": 2}), tmp_path, max_length=Epoch(2))
    assert [(e["epoch_idx"], e["batch_idx"]) for e in trial.log] == [(b // 4, b) for b in range(8)]
