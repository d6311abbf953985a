"""The LR scheduler wrapper: every step mode with frequency 1 and 2, gradient aggregation, the
state_dict round trip and the validation errors."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch

from determined_trials.pytorch import LRScheduler

Mode = LRScheduler.StepMode
EPOCH_LEN = 3


def _wrapped(mode: Mode, frequency: int) -> LRScheduler:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** step)
    return LRScheduler(scheduler, mode, frequency)


def _drive(wrapper: LRScheduler, batches: range, aggregation: int = 1) -> list[int]:
    """Act as the trainer; return the scheduler's step count after each batch."""
    counts = []
    for batch_idx in batches:
        stepped = (batch_idx + 1) % aggregation == 0
        if stepped:
            wrapper.scheduler.optimizer.step()
        wrapper.after_batch(
            batch_idx=batch_idx,
            optimizer_stepped=stepped,
            epoch_ended=(batch_idx + 1) % EPOCH_LEN == 0,
            epoch_idx=batch_idx // EPOCH_LEN,
        )
        counts.append(wrapper.scheduler.last_epoch)
    return counts


@pytest.mark.parametrize(("mode", "frequency", "aggregation", "expected"), [
    (Mode.STEP_EVERY_BATCH, 1, 1, [1, 2, 3, 4, 5, 6, 7, 8]),
    (Mode.STEP_EVERY_BATCH, 2, 1, [0, 1, 1, 2, 2, 3, 3, 4]),
    # under aggregation still one step per batch, never a burst on the optimizer-step batch
    (Mode.STEP_EVERY_BATCH, 1, 2, [1, 2, 3, 4, 5, 6, 7, 8]),
    (Mode.STEP_EVERY_BATCH, 2, 2, [0, 1, 1, 2, 2, 3, 3, 4]),
    (Mode.STEP_EVERY_OPTIMIZER_STEP, 1, 1, [1, 2, 3, 4, 5, 6, 7, 8]),
    (Mode.STEP_EVERY_OPTIMIZER_STEP, 2, 1, [0, 1, 1, 2, 2, 3, 3, 4]),
    (Mode.STEP_EVERY_OPTIMIZER_STEP, 1, 2, [0, 1, 1, 2, 2, 3, 3, 4]),
    # frequency counts optimizer steps: every 2nd optimizer step = every 4th batch
    (Mode.STEP_EVERY_OPTIMIZER_STEP, 2, 2, [0, 0, 0, 1, 1, 1, 1, 2]),
    (Mode.STEP_EVERY_EPOCH, 1, 1, [0, 0, 1, 1, 1, 2, 2, 2]),
    (Mode.STEP_EVERY_EPOCH, 2, 1, [0, 0, 0, 0, 0, 1, 1, 1]),
    (Mode.STEP_EVERY_EPOCH, 1, 2, [0, 0, 1, 1, 1, 2, 2, 2]),
    (Mode.MANUAL_STEP, 1, 1, [0] * 8),
    (Mode.MANUAL_STEP, 2, 2, [0] * 8),
])
def test_step_modes(mode: Mode, frequency: int, aggregation: int, expected: list[int]) -> None:
    assert _drive(_wrapped(mode, frequency), range(8), aggregation) == expected


def test_after_batch_says_whether_it_stepped() -> None:
    wrapper = _wrapped(Mode.STEP_EVERY_BATCH, 2)
    assert not wrapper.after_batch(0, True, False, 0)
    assert wrapper.after_batch(1, True, False, 0)


def _roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("stop_after", [1, 2, 5])
def test_state_dict_round_trip_continues_the_schedule(mode: Mode, stop_after: int) -> None:
    full = _wrapped(mode, 2)
    expected = _drive(full, range(16), aggregation=2)
    expected_lr = full.get_last_lr()

    first = _wrapped(mode, 2)
    head = _drive(first, range(stop_after), aggregation=2)
    state = _roundtrip(first.state_dict())
    resumed = _wrapped(mode, 2)
    resumed.load_state_dict(state)
    assert resumed.optimizer_steps == first.optimizer_steps == (stop_after // 2)
    tail = _drive(resumed, range(stop_after, 16), aggregation=2)
    assert head + tail == expected
    assert resumed.get_last_lr() == expected_lr


def test_bare_scheduler_state_dict_is_accepted() -> None:
    source = _wrapped(Mode.STEP_EVERY_BATCH, 1)
    _drive(source, range(3))
    target = _wrapped(Mode.STEP_EVERY_BATCH, 1)
    target.load_state_dict(source.scheduler.state_dict())
    assert target.scheduler.last_epoch == 3 and target.optimizer_steps == 0


def test_delegation_and_properties() -> None:
    wrapper = _wrapped(Mode.MANUAL_STEP, 3)
    wrapper.scheduler.optimizer.step()
    assert wrapper.step_mode is Mode.MANUAL_STEP and wrapper.frequency == 3
    wrapper.step()
    assert wrapper.scheduler.last_epoch == 1 and wrapper.get_last_lr() == [0.5]
    assert "LambdaLR" in repr(wrapper) and "MANUAL_STEP" in repr(wrapper)
    assert [(m.name, m.value) for m in Mode] == [
        ("STEP_EVERY_EPOCH", 1), ("STEP_EVERY_BATCH", 2), ("MANUAL_STEP", 3),
        ("STEP_EVERY_OPTIMIZER_STEP", 4)]


def _plateau() -> torch.optim.lr_scheduler.ReduceLROnPlateau:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)


def test_reduce_on_plateau_needs_manual_step() -> None:
    with pytest.raises(ValueError, match="ReduceLROnPlateau .*StepMode.MANUAL_STEP"):
        LRScheduler(_plateau(), Mode.STEP_EVERY_EPOCH)
    wrapper = LRScheduler(_plateau(), Mode.MANUAL_STEP)
    wrapper.step(1.0)
    assert not wrapper.after_batch(0, True, True, 0)


@pytest.mark.parametrize(("step_mode", "frequency", "error", "match"), [
    (1, 1, TypeError, "step_mode must be an LRScheduler.StepMode"),
    ("STEP_EVERY_BATCH", 1, TypeError, "step_mode must be an LRScheduler.StepMode"),
    (Mode.STEP_EVERY_BATCH, 0, ValueError, "frequency must be >= 1"),
    (Mode.STEP_EVERY_BATCH, 1.5, TypeError, "frequency must be an int"),
    (Mode.STEP_EVERY_BATCH, True, TypeError, "frequency must be an int"),
])
def test_argument_errors(step_mode: Any, frequency: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        LRScheduler(_wrapped(Mode.MANUAL_STEP, 1).scheduler, step_mode, frequency)


def test_not_a_scheduler() -> None:
    with pytest.raises(TypeError, match="needs a scheduler with a step\\(\\) method"):
        LRScheduler(object(), Mode.STEP_EVERY_BATCH)
