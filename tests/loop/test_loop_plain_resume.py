"""The loop's clock across a stop and a resume, with plain functions: a run stopped mid-epoch (a stop request,
a preemption, or the end of ``max_length``) and resumed from its checkpoint by a new controller trains exactly
the batches an uninterrupted run trains, fires each epoch's hooks once and ends with the same counters."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from plain_adapter import PlainAdapter, PlainRun, run_loop

from determined_trials.loop import Batch, ExitReason

# 8 records in batches of 2: epochs of 4 batches; validations every 4 batches, checkpoints every 6, 10 in all
SETTINGS: dict[str, Any] = {"validation_period": Batch(4), "checkpoint_period": Batch(6), "reporting_period": Batch(3)}
EPOCH_HOOKS = ("epoch_start", "epoch_end")


def _stop_after(batches: int) -> Callable[[PlainAdapter, int], None]:
    def stop(adapter: PlainAdapter, trained: int) -> None:
        if trained == batches:
            adapter.stop = True  # the trial asks to stop (context.set_stop_requested(True))

    return stop


def _preempt_after(batches: int) -> Callable[[PlainAdapter, int], None]:
    def preempt(adapter: PlainAdapter, trained: int) -> None:
        if trained == batches:
            assert adapter.core is not None
            adapter.core.preempt.request_preemption()

    return preempt


def _epoch_events(*runs: PlainRun) -> list[tuple[Any, ...]]:
    return [e for run in runs for e in run.events if e[0] in EPOCH_HOOKS]


def _final_state(run: PlainRun) -> dict[str, int]:
    """The counters of the run's last checkpoint (its trial id left out: runs in other folders differ)."""
    state = dict(run.stored[run.checkpoints[-1].uuid].trial_state)
    del state["trial_id"]
    return state


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> PlainRun:
    return run_loop(tmp_path_factory.mktemp("whole"), max_length=Batch(10), **SETTINGS)


@pytest.mark.parametrize("stop_at", [5, 7, 4], ids=["mid-epoch", "before-the-epoch-end", "at-the-epoch-end"])
@pytest.mark.parametrize(("how", "reason"), [(_stop_after, ExitReason.STOPPED),
                                             (_preempt_after, ExitReason.PREEMPTED)], ids=["stop", "preempt"])
def test_a_stopped_run_resumes_where_it_stopped(
    tmp_path: Path, uninterrupted: PlainRun, stop_at: int, how: Callable[[int], Any], reason: ExitReason,
) -> None:
    first = run_loop(tmp_path, max_length=Batch(10), after_batch=how(stop_at), **SETTINGS)
    assert first.reason is reason
    stop_checkpoint = first.checkpoints[-1]
    assert stop_checkpoint.steps_completed == stop_at
    assert first.stored[stop_checkpoint.uuid].trial_state["batches_trained"] == stop_at
    assert first.stored[stop_checkpoint.uuid].trial_state["epochs_trained"] == stop_at // 4
    second = run_loop(tmp_path, latest_checkpoint=stop_checkpoint.uuid, max_length=Batch(10), **SETTINGS)
    assert second.reason is ExitReason.COMPLETED and second.trial_id == first.trial_id
    assert second.events[:3] == [("startup", stop_at, stop_checkpoint.uuid), ("load", first.adapter.w),
                                 ("start_training", stop_at)]
    # every batch once, in order, with the same records and epoch: the same model, bit for bit
    assert first.adapter.trained + second.adapter.trained == uninterrupted.adapter.trained
    assert second.adapter.w == uninterrupted.adapter.w
    # an epoch open at the stop is adopted: its start hook is not fired again, its end hook fires once
    assert _epoch_events(first, second) == _epoch_events(uninterrupted)
    assert _final_state(second) == _final_state(uninterrupted)
    # the validations: at 4 (owed after a stop at 4, where the stop came before validating), 8 and 10
    assert first.steps_of("validation_end") + second.steps_of("validation_end") == [4, 8, 10]
    stored = [(m.steps_completed, m.metrics["epochs"], m.metrics["validation_loss"]) for m in second.validation]
    assert stored == [(m.steps_completed, m.metrics["epochs"], m.metrics["validation_loss"])
                      for m in uninterrupted.validation]


def test_a_stop_at_a_validation_boundary_is_validated_first_after_the_resume(tmp_path: Path) -> None:
    first = run_loop(tmp_path, max_length=Batch(10), after_batch=_stop_after(4), **SETTINGS)
    assert first.steps_of("validation_end") == []
    assert first.stored[first.checkpoints[-1].uuid].trial_state["last_validation"] == 0
    second = run_loop(tmp_path, latest_checkpoint=first.checkpoints[-1].uuid, max_length=Batch(10), **SETTINGS)
    assert [e[0] for e in second.events[3:7]] == ["training_start", "validation_start", "validate", "validation_end"]


def test_a_run_ended_by_max_length_mid_epoch_goes_on_to_a_longer_one(tmp_path: Path, uninterrupted: PlainRun) -> None:
    first = run_loop(tmp_path, max_length=Batch(5), **SETTINGS)
    assert first.reason is ExitReason.COMPLETED
    assert [c.steps_completed for c in first.checkpoints] == [5]
    assert _epoch_events(first) == [("epoch_start", 0), ("epoch_end", 0), ("epoch_start", 1)]  # epoch 1 stays open
    second = run_loop(tmp_path, latest_checkpoint=first.checkpoints[-1].uuid, max_length=Batch(10), **SETTINGS)
    assert first.adapter.trained + second.adapter.trained == uninterrupted.adapter.trained
    assert second.adapter.w == uninterrupted.adapter.w
    assert _epoch_events(first, second) == _epoch_events(uninterrupted)
    assert _final_state(second) == _final_state(uninterrupted)


@pytest.mark.parametrize("checkpoint_period", [None, Batch(3)],
                         ids=["checkpoint-at-the-end-only", "checkpoint-period-fires-at-the-end"])
def test_a_run_resumed_at_its_length_trains_and_validates_nothing_more(
    tmp_path: Path, checkpoint_period: Batch | None,
) -> None:
    settings: dict[str, Any] = {"max_length": Batch(6), "validation_period": Batch(4), "checkpoint_period": checkpoint_period}
    first = run_loop(tmp_path, **settings)
    assert first.steps_of("validation_end") == [4, 6]
    second = run_loop(tmp_path, latest_checkpoint=first.checkpoints[-1].uuid, **settings)
    assert second.checkpoints == first.checkpoints  # no second checkpoint of the same batch
    assert second.adapter.trained == []
    assert second.adapter.w == first.adapter.w
    assert second.steps_of("validation_end") == []
    assert [m.steps_completed for m in second.validation] == [4, 6]
