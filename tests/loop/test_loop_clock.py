"""The loop's clock with plain functions (no torch, no TensorFlow): advancing it, the batch being trained and
its place in its epoch with a known and an unknown epoch length, the read-only view, the checkpointed counters
(``trial_state.json``'s format) and a stop mid-epoch resumed from them, with the same boundaries and hooks."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from determined_trials.loop import Clock, ClockView, HookRunner

Trace = list[tuple[Any, ...]]


class _Hooks:
    """A callback recording the epoch hooks with the position the view shows at that moment."""

    def __init__(self, trace: Trace, view: Callable[[], ClockView]) -> None:
        self.trace, self._view = trace, view

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.trace.append(("start", epoch_idx, self._view().batches_trained))

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.trace.append(("end", epoch_idx, self._view().batches_trained))


def _clock(trace: Trace, epoch_len: int | None, state: dict[str, Any] | None = None) -> Clock:
    holder: list[Clock] = []
    clock = Clock(HookRunner({"hooks": _Hooks(trace, lambda: holder[0].view)}))
    holder.append(clock)
    if state is not None:
        clock.load_state_dict(state)
    clock.start(epoch_len)
    return clock


def _per_batch(clock: Clock, batches: int, trace: Trace) -> None:
    """A per-batch adapter (DeepSpeed, Keras): the batch, then where the view says it is."""
    for _ in range(batches):
        clock.begin()
        trace.append(("batch", clock.view.batch_idx, clock.view.epoch_position(), clock.at_epoch_end()))
        clock.advance()


def _in_runs(clock: Clock, batches: int, trace: Trace, run: int = 2) -> None:
    """The PyTorch tight loop: runs within an epoch, ``batch_idx`` moved per batch, one advance per run."""
    while batches > 0:
        _epoch, _in_epoch, count = clock.begin(min(run, batches))
        first = clock.batches_trained
        for batch_idx in range(first, first + count):
            clock.batch_idx = batch_idx
            trace.append(("batch", clock.view.batch_idx, clock.view.epoch_position(), clock.at_epoch_end()))
        clock.advance(count)
        batches -= count


def test_a_new_clock_knows_no_batch() -> None:
    clock = Clock()
    assert clock.view.batch_idx is None and clock.epoch_position() is None and not clock.at_epoch_end()
    assert clock.state_dict() == dict.fromkeys(
        ("trial_id", "batches_trained", "epochs_trained", "last_validation", "last_checkpoint",
         "searcher_ops_completed"), 0)


def test_advancing_moves_the_position_and_the_counts() -> None:
    trace: Trace = []
    clock = _clock(trace, 3)
    _per_batch(clock, 4, trace)
    assert [t for t in trace if t[0] == "batch"] == [
        ("batch", 0, (0, 0), False), ("batch", 1, (0, 1), False), ("batch", 2, (0, 2), True),
        ("batch", 3, (1, 0), False),
    ]
    view = clock.view
    assert (view.batches_trained, view.epochs_trained, view.batch_idx, view.epoch_len) == (4, 1, 3, 3)
    assert view.epoch_position() == (1, 0)  # between batches: the last one trained


def test_runs_and_single_batches_give_the_same_boundaries() -> None:
    one: Trace = []
    _per_batch(_clock(one, 3), 8, one)
    runs: Trace = []
    _in_runs(_clock(runs, 3), 8, runs, run=5)
    assert runs == one
    assert [t for t in one if t[0] != "batch"] == [
        ("start", 0, 0), ("end", 0, 3), ("start", 1, 3), ("end", 1, 6), ("start", 2, 6)]


def test_an_unknown_epoch_length_takes_the_position_from_the_pass() -> None:
    clock = _clock([], None)
    clock.begin()
    assert clock.epoch_position() is None  # data without a length and no pass: the epoch cannot be known
    clock.advance()
    clock.begin_pass(4, 2)
    assert (clock.view.batch_idx, clock.view.epoch_position(), clock.at_epoch_end()) == (1, (4, 2), False)


def test_a_known_length_decides_the_position_even_over_a_short_pass() -> None:
    # A raw loader with a len of 3 whose first pass ends after 1 batch: the position is by length (what the
    # context's getters said before), the epoch's end by the pass (what LR schedulers and epoch hooks get).
    trace: Trace = []
    clock = _clock(trace, 3)
    clock.begin_pass(0, 0)
    clock.advance()
    clock.begin_pass(1, 2)  # a pass of its own says batch 2 of epoch 1
    assert (clock.epoch_position(), clock.at_epoch_end()) == ((0, 1), True)
    clock.advance()
    assert trace == [("start", 0, 0), ("end", 0, 2)] and clock.epochs_trained == 1


def test_the_view_only_reads() -> None:
    clock = Clock()
    with pytest.raises(AttributeError):
        clock.view.batch_idx = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        clock.view.batches_trained = 3  # type: ignore[misc]
    assert not hasattr(clock.view, "advance") and not hasattr(clock.view, "begin")


def test_the_epoch_length_is_checked_and_zero_means_unknown() -> None:
    clock = Clock()
    with pytest.raises(ValueError, match="epoch_len must be >= 1"):
        clock.start(-1)
    clock.start(0)
    assert clock.epoch_len is None


def test_the_saved_counters_keep_trial_state_json_format() -> None:
    clock = Clock(trial_id=7, batches_trained=5, epochs_trained=1, last_validation=3, last_checkpoint=5,
                  searcher_ops_completed=2)
    clock.start(3)
    clock.begin()  # the epoch and the position are not saved: only the counters are
    assert json.dumps(clock.state_dict(), indent=1) == (
        '{\n "trial_id": 7,\n "batches_trained": 5,\n "epochs_trained": 1,\n "last_validation": 3,\n'
        ' "last_checkpoint": 5,\n "searcher_ops_completed": 2\n}')
    again = Clock()
    again.load_state_dict({"batches_trained": "5", "epochs_trained": 1.0})  # older files: ints as written
    assert (again.batches_trained, again.epochs_trained, again.trial_id) == (5, 1, 0)
    with pytest.raises(ValueError, match=r"unknown trial state keys \['bogus'\]"):
        again.load_state_dict({"bogus": 1})


@pytest.mark.parametrize("train", [_per_batch, _in_runs])
@pytest.mark.parametrize("stop_after", [1, 4, 5, 6])
def test_a_stop_mid_epoch_resumes_with_the_same_boundaries_and_hooks(train: Any, stop_after: int) -> None:
    whole: Trace = []
    uninterrupted = _clock(whole, 3)
    train(uninterrupted, 9, whole)
    first: Trace = []
    before = _clock(first, 3)
    train(before, stop_after, first)
    saved = json.loads(json.dumps(before.state_dict()))  # what trial_state.json holds
    second: Trace = []
    after = _clock(second, 3, saved)
    assert after.view.batch_idx is None  # no batch of this run yet
    train(after, 9 - stop_after, second)
    assert first + second == whole  # each epoch started once, ended once, at the same batches
    assert after.state_dict() == uninterrupted.state_dict()
    assert (after.batches_trained, after.epochs_trained) == (9, 3)


def test_a_stream_resumed_mid_pass_adopts_its_epoch() -> None:
    # Epochs decided by passes (no length): the stream resumes in epoch 1 at batch 2 of its pass.
    trace: Trace = []
    clock = _clock(trace, None, {"batches_trained": 6, "epochs_trained": 1})
    for in_epoch in (2, 3):
        clock.begin_pass(1, in_epoch)
        clock.advance()
    clock.begin_pass(2, 0)
    clock.advance()
    assert trace == [("end", 1, 8), ("start", 2, 8)]  # no second start of epoch 1
    assert (clock.batches_trained, clock.epochs_trained, clock.view.epoch_position()) == (9, 2, (2, 0))
