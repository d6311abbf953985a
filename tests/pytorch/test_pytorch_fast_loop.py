"""Issue 12: the trainer's per-batch loop takes a run of batches inside one epoch at a time, keeps a
lone loss without per-batch checks and reduces it in fewer steps. Positions, epoch hooks, metrics and
errors must be what the general path gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trials_pytorch import LINEAR_XS, LinearTrial, config, fit

import determined_trials as det
from determined_trials import pytorch
from determined_trials.loop import ExitReason
from determined_trials.pytorch.metrics._metrics import TrainingMetrics

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)


def test_the_lone_loss_mean_equals_the_general_reduction() -> None:
    gen = torch.Generator().manual_seed(5)
    losses = list(torch.rand(3000, generator=gen, dtype=torch.float32) * 10)  # more than one compaction
    fast, general = TrainingMetrics(), TrainingMetrics()
    fast.add(losses[0])
    general.add(losses[0])
    sink = fast.loss_sink()
    assert sink is not None
    pending, room = sink
    appended = 0
    for loss in losses[1:]:
        pending.append(loss.detach())
        appended += 1
        room -= 1
        if room == 0:
            fast.count_losses(appended)
            appended = 0
            sink = fast.loss_sink()
            assert sink is not None and sink[0] is pending  # the same list, emptied in place
            room = sink[1]
        general.add(loss)
    fast.count_losses(appended)
    expected = general.combine([general.summary()])
    assert fast.local_loss_mean() == expected  # bit for bit
    assert fast.total_batches == general.total_batches == 3000


def test_no_sink_until_the_outputs_are_a_lone_scalar_loss() -> None:
    metrics = TrainingMetrics()
    assert metrics.loss_sink() is None
    metrics.add({"loss": torch.tensor(1.0), "acc": torch.tensor(0.5)})
    assert metrics.loss_sink() is None and metrics.local_loss_mean() is None
    metrics.reset()
    metrics.add(torch.ones(2))  # a non-scalar "loss" is averaged element-wise by the general path
    assert metrics.local_loss_mean() is None


class _ShapeChange(LinearTrial):
    """Returns a scalar loss, then (at batch 3) a loss of shape [2]."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        loss = super().train_batch(batch, epoch_idx, batch_idx)
        return loss.repeat(2) if batch_idx == 3 else loss


def test_a_loss_that_changes_shape_is_reported_at_the_boundary(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"metric 'loss' has shape \[2\]"):
        fit(_ShapeChange, config({"global_batch_size": 1}), tmp_path, max_length=pytorch.Batch(8),
            reporting_period=pytorch.Batch(4))


class _Positions(LinearTrial):
    """Records what train_batch and the context say about the position of every batch."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        ctx = self.context
        self.events.append(("position", batch_idx, epoch_idx, ctx.current_train_batch(), ctx.current_train_epoch(),
                            ctx.is_epoch_start(), ctx.is_epoch_end()))
        return super().train_batch(batch, epoch_idx, batch_idx)


@pytest.mark.parametrize("reporting", [1, 3, 5])
def test_positions_and_epoch_hooks_across_runs_and_epochs(tmp_path: Path, reporting: int) -> None:
    """Epochs of 4 batches (8 records, batch 2); workloads of 1, 3 or 5 batches cross epoch ends."""
    trial, _, info = fit(_Positions, config({"global_batch_size": 2}), tmp_path, max_length=pytorch.Batch(11),
                         reporting_period=pytorch.Batch(reporting))
    epoch_len = len(LINEAR_XS) // 2
    positions = [e[1:] for e in trial.events if e[0] == "position"]
    assert positions == [(b, b // epoch_len, b, b // epoch_len, b % epoch_len == 0, b % epoch_len == epoch_len - 1)
                         for b in range(11)]
    hooks = [e for e in trial.events if e[0] in ("epoch_start", "epoch_end")]
    assert hooks == [("epoch_start", 0), ("epoch_end", 0), ("epoch_start", 1), ("epoch_end", 1), ("epoch_start", 2)]
    assert [m.steps_completed for m in info["training"]] == sorted({*range(reporting, 12, reporting), 11})


class _StopAt(LinearTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        if batch_idx == 5:
            self.context.set_stop_requested(True)
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_a_stop_request_ends_the_run_after_that_batch(tmp_path: Path) -> None:
    trial, trainer, info = fit(_StopAt, config({"global_batch_size": 1}), tmp_path, max_length=pytorch.Batch(8),
                               reporting_period=pytorch.Batch(100))
    assert [e[1] for e in trial.events if e[0] == "batch"] == list(range(6))
    assert trainer.exit_reason is ExitReason.STOPPED
    assert [c.steps_completed for c in info["checkpoints"]] == [6]
    assert [m.steps_completed for m in info["training"]] == [6]


class _MixedOutputs(LinearTrial):
    """Returns the loss as a tensor, except every third batch as {"loss": tensor}."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        loss = super().train_batch(batch, epoch_idx, batch_idx)
        return {"loss": loss} if batch_idx % 3 == 2 else loss


def test_tensor_and_dict_losses_in_one_run_are_all_reduced(tmp_path: Path) -> None:
    trial, _, info = fit(_MixedOutputs, config({"global_batch_size": 1}), tmp_path, max_length=pytorch.Batch(10),
                         reporting_period=pytorch.Batch(5))
    losses = [entry["loss"] for entry in trial.log]
    reported = [m.metrics["loss"] for m in info["training"]]
    assert [m.steps_completed for m in info["training"]] == [5, 10]
    assert reported == pytest.approx([sum(losses[:5]) / 5, sum(losses[5:]) / 5], rel=1e-6)


class _FailsAt(LinearTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        if batch_idx == 6:
            raise RuntimeError("boom at batch 6")
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_an_error_inside_a_run_propagates_and_keeps_the_reports_before_it(tmp_path: Path) -> None:
    trial_id = None
    with pytest.raises(RuntimeError, match="boom at batch 6"), \
            pytorch.init(exp_conf=config({"global_batch_size": 1}), run_dir=tmp_path) as context:
        trial_id = context.get_trial_id()
        trial = _FailsAt(context)
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(10), reporting_period=pytorch.Batch(4),
                                            show_progress=False)
    assert [e[1] for e in trial.events if e[0] == "batch"] == list(range(6))  # batch 6 raised; nothing after it
    assert context.current_train_batch() == 6  # the position names the batch that failed
    metrics = det.core.LocalStore(tmp_path).metrics(trial_id, group="training")
    assert [m.steps_completed for m in metrics] == [4]  # the report before the failing batch is stored
