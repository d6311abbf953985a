"""Units and the schedule: periods, explicit points, epoch and record conversion, boundaries."""

from __future__ import annotations

import pytest

from determined_trials.loop import (
    Batch,
    Boundary,
    Clock,
    Epoch,
    Record,
    Schedule,
    summary_line,
    unit_from_length,
)


def test_batch_period_and_points() -> None:
    every3 = Batch(3).to_batch_rule(epoch_len=None, global_batch_size=None)
    assert [b for b in range(1, 13) if every3.fires(b)] == [3, 6, 9, 12]
    assert every3.next_after(0) == 3 and every3.next_after(3) == 6 and every3.next_after(4) == 6
    points = Batch([5, 30, 45]).to_batch_rule(epoch_len=None, global_batch_size=None)
    assert [b for b in range(60) if points.fires(b)] == [5, 30, 45]
    assert points.next_after(5) == 30 and points.next_after(45) is None


def test_epoch_rules_fire_at_epoch_ends() -> None:
    rule = Epoch(2).to_batch_rule(epoch_len=4, global_batch_size=None)
    assert [b for b in range(1, 25) if rule.fires(b)] == [8, 16, 24]
    assert rule.next_after(8) == 16
    pts = Epoch([1, 3]).to_batch_rule(epoch_len=5, global_batch_size=None)
    assert [b for b in range(1, 30) if pts.fires(b)] == [5, 15]
    assert Epoch(3).to_batches(epoch_len=7, global_batch_size=None) == 21


def test_record_units_use_the_global_batch_size() -> None:
    assert Record(100).to_batches(epoch_len=None, global_batch_size=32) == 3
    assert Record(10).to_batches(epoch_len=None, global_batch_size=32) == 1
    rule = Record(64).to_batch_rule(epoch_len=None, global_batch_size=16)
    assert rule.next_after(0) == 4


def test_unit_errors_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="period must be >= 1"):
        Batch(0)
    with pytest.raises(TypeError):
        Batch("5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has none.*batches or records"):
        Epoch(1).to_batch_rule(epoch_len=None, global_batch_size=None)
    with pytest.raises(ValueError, match="global_batch_size"):
        Record(10).to_batches(epoch_len=10, global_batch_size=None)
    with pytest.raises(ValueError, match="schedule of points"):
        Batch([1, 2]).to_batches(epoch_len=None, global_batch_size=None)


def test_units_are_values() -> None:
    assert Batch(5) == Batch(5) and Batch(5) != Epoch(5)
    assert Batch([3, 1, 3]) == Batch((1, 3))
    assert repr(Epoch([1, 2])) == "Epoch([1, 2])"
    assert unit_from_length(4, "epochs") == Epoch(4) and unit_from_length(4, None) == Batch(4)
    with pytest.raises(AttributeError):
        Batch(1).value = 2  # type: ignore[misc]


def test_schedule_boundaries() -> None:
    schedule = Schedule(
        reporting=Batch(3).to_batch_rule(epoch_len=4, global_batch_size=None),
        validation=Batch(4).to_batch_rule(epoch_len=4, global_batch_size=None),
        checkpoint=Batch(6).to_batch_rule(epoch_len=4, global_batch_size=None),
    )
    ends, trained = [], 0
    while trained < 10:
        trained = schedule.next_boundary(trained, 10)
        ends.append((trained, schedule.fired(trained, 10)))
    assert [e for e, _ in ends] == [3, 4, 6, 8, 9, 10]
    assert ends[1][1] == Boundary.VALIDATE
    assert ends[2][1] == Boundary.REPORT | Boundary.CHECKPOINT
    assert Boundary.TARGET in ends[-1][1]


def test_trial_state_round_trip() -> None:
    state = Clock(trial_id=3, batches_trained=10, epochs_trained=2, last_validation=8, last_checkpoint=10)
    again = Clock()
    again.load_state_dict(state.state_dict())
    assert again.state_dict() == state.state_dict() == {
        "trial_id": 3, "batches_trained": 10, "epochs_trained": 2, "last_validation": 8, "last_checkpoint": 10,
        "searcher_ops_completed": 0,
    }
    with pytest.raises(ValueError, match="unknown trial state keys"):
        again.load_state_dict({"bogus": 1})


def test_a_summary_line_says_epochs_completed_not_an_epoch_number() -> None:
    line = summary_line("training", 500, 2, {"batches": 500, "epochs": 2, "loss": 0.123456})
    assert line == "[training] batch 500 (epochs completed: 2): loss=0.1235"
