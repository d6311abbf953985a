"""Trainer.fit on y = w * x in closed form: loss and weight after every batch (batch sizes 1 and 2),
gradient aggregation, gradient clipping, reported and validation losses, LR step modes, bf16 AMP."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from trials_pytorch import LINEAR_TRUE_W, LINEAR_XS, LinearTrial, config, fit

from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)

LR = 0.1


def _closed_form(
    batches: int, batch_size: int, *, aggregation: int = 1, average: bool = True, clip: float = 0.0,
) -> list[dict[str, float]]:
    """Per batch, in float64: the batch's MSE loss (at the weight it saw) and w after the batch."""
    w, pending, out = 0.0, 0.0, []
    per_epoch = len(LINEAR_XS) // batch_size
    for b in range(batches):
        start = (b % per_epoch) * batch_size
        xs = LINEAR_XS[start:start + batch_size]
        loss = sum((w * x - LINEAR_TRUE_W * x) ** 2 for x in xs) / len(xs)
        pending += sum(2 * x * (w * x - LINEAR_TRUE_W * x) for x in xs) / len(xs)
        if (b + 1) % aggregation == 0:
            grad = pending / aggregation if average else pending
            if clip:
                grad *= min(1.0, clip / (abs(grad) + 1e-6))
            w -= LR * grad
            pending = 0.0
        out.append({"loss": loss, "w": w})
    return out


def _assert_matches(log: list[dict[str, Any]], expected: list[dict[str, float]]) -> None:
    assert len(log) == len(expected)
    for i, (got, want) in enumerate(zip(log, expected)):
        assert got["batch_idx"] == i
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-6), f"loss after batch {i}"
        assert got["w"] == pytest.approx(want["w"], rel=1e-5, abs=1e-6), f"w after batch {i}"


@pytest.mark.parametrize("batch_size", [1, 2])
def test_loss_and_weight_after_every_batch(tmp_path: Path, batch_size: int) -> None:
    n = 10
    trial, trainer, info = fit(
        LinearTrial, config({"global_batch_size": batch_size, "lr": LR}), tmp_path,
        max_length=Batch(n), reporting_period=Batch(1), validation_period=Batch(5),
    )
    expected = _closed_form(n, batch_size)
    _assert_matches(trial.log, expected)
    per_epoch = len(LINEAR_XS) // batch_size
    assert [e["indices"][0] for e in trial.log] == [(b % per_epoch) * batch_size for b in range(n)]  # unshuffled
    # the reported training loss of each one-batch workload is that batch's loss
    reported = [(m.steps_completed, m.metrics["loss"]) for m in info["training"]]
    assert reported == [(b + 1, pytest.approx(e["loss"], rel=1e-5, abs=1e-6)) for b, e in enumerate(expected)]
    # validation_loss: the record-weighted mean over the whole validation set at that weight
    for record in info["validation"]:
        w = expected[record.steps_completed - 1]["w"]
        mse = sum((w * x - LINEAR_TRUE_W * x) ** 2 for x in LINEAR_XS) / len(LINEAR_XS)
        assert record.metrics["validation_loss"] == pytest.approx(mse, rel=1e-4, abs=1e-6)
    assert [r.steps_completed for r in info["validation"]] == [5, 10]
    assert trial.weight == pytest.approx(expected[-1]["w"], rel=1e-6)


def test_reported_loss_is_the_workload_mean(tmp_path: Path) -> None:
    trial, _, info = fit(
        LinearTrial, config({"global_batch_size": 1, "lr": LR}), tmp_path,
        max_length=Batch(9), reporting_period=Batch(3),
    )
    losses = [e["loss"] for e in _closed_form(9, 1)]
    reported = [(m.steps_completed, m.metrics["loss"]) for m in info["training"]]
    assert reported == [(k, pytest.approx(sum(losses[k - 3:k]) / 3, rel=1e-5)) for k in (3, 6, 9)]


@pytest.mark.parametrize("where", ["config", "init"])
def test_gradient_aggregation_steps_every_second_batch_with_the_mean_gradient(tmp_path: Path, where: str) -> None:
    conf = config({"global_batch_size": 1, "lr": LR})
    init_kwargs = {}
    if where == "config":
        conf["optimizations"] = {"aggregation_frequency": 2}
    else:
        init_kwargs = {"aggregation_frequency": 2}
    trial, _, _ = fit(LinearTrial, conf, tmp_path, init_kwargs=init_kwargs, max_length=Batch(8))
    expected = _closed_form(8, 1, aggregation=2)
    _assert_matches(trial.log, expected)
    weights = [e["w"] for e in trial.log]
    assert weights[0] == 0.0 and weights[2] == weights[1] and weights[4] == weights[3]  # no step on even batches
    assert weights[1] != 0.0


def test_aggregation_without_averaging_sums_the_gradients(tmp_path: Path) -> None:
    conf = config({"global_batch_size": 1, "lr": LR}, optimizations={
        "aggregation_frequency": 2, "average_aggregated_gradients": False,
    })
    trial, _, _ = fit(LinearTrial, conf, tmp_path, max_length=Batch(2))
    _assert_matches(trial.log, _closed_form(2, 1, aggregation=2, average=False))


def test_clip_grads_clips_to_the_norm(tmp_path: Path) -> None:
    trial, _, _ = fit(LinearTrial, config({"global_batch_size": 2, "lr": LR, "clip": 0.1}), tmp_path, max_length=Batch(6))
    expected = _closed_form(6, 2, clip=0.1)
    _assert_matches(trial.log, expected)
    steps = [b["w"] - a["w"] for a, b in zip([{"w": 0.0}, *expected], expected)]
    assert steps[0] == pytest.approx(LR * 0.1, rel=1e-4)  # the first gradient (-3.75) is cut to norm 0.1
    assert all(abs(s) <= LR * 0.1 + 1e-9 for s in steps)


def test_clip_grads_with_aggregation(tmp_path: Path) -> None:
    conf = config({"global_batch_size": 1, "lr": LR, "clip": 0.5}, optimizations={"aggregation_frequency": 2})
    trial, _, _ = fit(LinearTrial, conf, tmp_path, max_length=Batch(6))
    _assert_matches(trial.log, _closed_form(6, 1, aggregation=2, clip=0.5))


# -- LR step modes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "frequency", "aggregation", "manual_every", "steps_after"),
    [
        ("STEP_EVERY_BATCH", 1, 1, 0, lambda b: b),
        ("STEP_EVERY_BATCH", 3, 1, 0, lambda b: b // 3),
        ("STEP_EVERY_EPOCH", 1, 1, 0, lambda b: b // 4),
        ("STEP_EVERY_EPOCH", 2, 1, 0, lambda b: b // 8),
        ("STEP_EVERY_OPTIMIZER_STEP", 1, 2, 0, lambda b: b // 2),
        ("STEP_EVERY_OPTIMIZER_STEP", 2, 2, 0, lambda b: b // 4),
        ("MANUAL_STEP", 1, 1, 0, lambda b: 0),
        ("MANUAL_STEP", 1, 1, 3, lambda b: b // 3),
    ],
)
def test_lr_step_modes(
    tmp_path: Path, mode: str, frequency: int, aggregation: int, manual_every: int, steps_after: Any,
) -> None:
    """StepLR(step_size=1, gamma=0.5); 4 batches per epoch; the lr seen by batch b is 0.1 * 0.5**steps."""
    n = 10
    hparams = {"global_batch_size": 2, "lr": LR, "lr_mode": mode, "lr_frequency": frequency,
               "manual_every": manual_every}
    conf = config(hparams, optimizations={"aggregation_frequency": aggregation})
    trial, _, _ = fit(LinearTrial, conf, tmp_path, max_length=Batch(n), validation_period=Batch(4))
    seen = [e["lr"] for e in trial.log]
    assert seen == [pytest.approx(LR * 0.5 ** steps_after(b), rel=1e-12) for b in range(n)]
    final = trial.optimizer.param_groups[0]["lr"]
    assert final == pytest.approx(LR * 0.5 ** steps_after(n), rel=1e-12)


# -- mixed precision -------------------------------------------------------------------------------


def test_bf16_autocast_in_train_batch_trains(tmp_path: Path) -> None:
    trial, _, _ = fit(LinearTrial, config({"global_batch_size": 2, "lr": LR, "amp": "autocast"}), tmp_path,
                      max_length=Batch(12))
    assert set(trial.output_dtypes) == {torch.bfloat16}
    assert torch.bfloat16 in trial.forward_dtypes
    assert trial.layer.weight.dtype == torch.float32
    expected = _closed_form(12, 2)[-1]["w"]
    assert trial.weight == pytest.approx(expected, rel=2e-2)  # bf16 forward: close to the float32 result
    assert abs(trial.weight - LINEAR_TRUE_W) < abs(0.0 - LINEAR_TRUE_W) / 2  # and it learns
    assert all(math.isfinite(e["loss"]) for e in trial.log)


def test_use_amp_runs_the_model_in_bf16_and_returns_float32(tmp_path: Path) -> None:
    trial, _, _ = fit(LinearTrial, config({"global_batch_size": 2, "lr": LR, "amp": "use_amp"}), tmp_path,
                      max_length=Batch(12), validation_period=Batch(6))
    assert set(trial.forward_dtypes) == {torch.bfloat16}  # the layer ran under autocast (training and validation)
    assert set(trial.output_dtypes) == {torch.float32}  # but the model hands back float32
    assert trial.weight == pytest.approx(_closed_form(12, 2)[-1]["w"], rel=2e-2)
    assert trial.context.scalers == []  # bf16 needs no GradScaler
