"""The epochs of the loop's clock, as every adapter reports its batches: opening and closing epochs, the
epoch hooks' order and arguments, the batch and epoch counts, resuming mid-epoch and a raw loader's short pass."""

from __future__ import annotations

from typing import Any

from determined_trials.loop import Clock, HookRunner


class _Recorder:
    """A callback that records the epoch hooks it sees, with the counts at that moment."""

    def __init__(self, trace: list[Any]) -> None:
        self.trace = trace
        self.clock: Clock | None = None

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        assert self.clock is not None
        self.trace.append(("start", epoch_idx, self.clock.batches_trained, self.clock.epochs_trained))

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        assert self.clock is not None
        self.trace.append(("end", epoch_idx, self.clock.batches_trained, self.clock.epochs_trained))


def _clock(epoch_len: int | None, **counters: int) -> tuple[Clock, list[Any]]:
    trace: list[Any] = []
    recorders = [_Recorder(trace), _Recorder(trace)]
    clock = Clock(HookRunner({"first": recorders[0], "second": recorders[1]}), **counters)
    clock.start(epoch_len)
    for recorder in recorders:
        recorder.clock = clock
    return clock, trace


def _train(clock: Clock, batches: int) -> None:
    """A per-batch adapter over data of known length (DeepSpeed, Keras, a det DataLoader)."""
    for _ in range(batches):
        clock.begin()
        clock.advance()


def test_epochs_open_and_close_around_their_batches_in_callback_order() -> None:
    clock, trace = _clock(3)
    _train(clock, 7)
    assert trace == [
        ("start", 0, 0, 0), ("start", 0, 0, 0),  # both callbacks, in registration order
        ("end", 0, 3, 0), ("end", 0, 3, 0),      # after the epoch's last batch is counted, before the epoch
        ("start", 1, 3, 1), ("start", 1, 3, 1),
        ("end", 1, 6, 1), ("end", 1, 6, 1),
        ("start", 2, 6, 2), ("start", 2, 6, 2),
    ]
    assert (clock.batches_trained, clock.epochs_trained, clock.open_epoch) == (7, 2, 2)


def test_a_run_of_batches_counts_them_once_and_closes_at_the_epoch_end() -> None:
    # The PyTorch tight loop: one begin per run within an epoch, one advance.
    clock, trace = _clock(4)
    runs = []
    for limit in (2, 5, 3):
        runs.append(clock.begin(limit))
        clock.advance(runs[-1][2])
    assert runs == [(0, 0, 2), (0, 2, 2), (1, 0, 3)]  # a run never crosses an epoch's end
    assert [t[:2] for t in trace[::2]] == [("start", 0), ("end", 0), ("start", 1)]
    assert (clock.batches_trained, clock.epochs_trained, clock.open_epoch) == (7, 1, 1)


def test_a_failed_run_counts_its_batches_without_closing_the_epoch() -> None:
    clock, trace = _clock(2)
    clock.begin(2)
    clock.advance(2, closes=False)
    assert (clock.batches_trained, clock.epochs_trained, clock.open_epoch) == (2, 0, 0)
    assert [t[:2] for t in trace[::2]] == [("start", 0)]


def test_resumed_mid_epoch_adopts_the_open_epoch_without_a_second_start() -> None:
    clock, trace = _clock(3, batches_trained=4, epochs_trained=1)  # a checkpoint taken after batch 0 of epoch 1
    _train(clock, 1)
    assert clock.open_epoch == 1 and trace == []  # its start hook ran before the stop
    _train(clock, 2)
    assert [t[:2] for t in trace[::2]] == [("end", 1), ("start", 2)]
    assert (clock.batches_trained, clock.epochs_trained) == (7, 2)


def test_resumed_at_an_epoch_boundary_opens_the_next_epoch() -> None:
    clock, trace = _clock(3, batches_trained=6, epochs_trained=2)
    _train(clock, 1)
    assert [t[:2] for t in trace[::2]] == [("start", 2)] and clock.epochs_trained == 2


def test_a_raw_loaders_short_pass_is_closed_when_the_next_begins() -> None:
    # A raw loader's passes decide the epochs: 3 batches, then a pass that ends after 2 (len says 3).
    clock, trace = _clock(3)
    for epoch_idx, in_epoch in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)]:
        clock.begin_pass(epoch_idx, in_epoch)
        assert clock.at_epoch_end() == (in_epoch == 2)
        clock.advance()
    assert [t[:3] for t in trace[::2]] == [
        ("start", 0, 0), ("end", 0, 3), ("start", 1, 3),
        ("end", 1, 5), ("start", 2, 5),  # the short pass 1 ends as pass 2 begins, before its start hook
    ]
    assert (clock.batches_trained, clock.epochs_trained, clock.open_epoch) == (6, 2, 2)


def test_a_stream_without_length_closes_an_epoch_only_when_the_next_pass_begins() -> None:
    clock, trace = _clock(None)
    for epoch_idx, in_epoch in [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]:
        clock.begin_pass(epoch_idx, in_epoch)
        assert not clock.at_epoch_end()
        clock.advance()
    assert [t[:3] for t in trace[::2]] == [("start", 0, 0), ("end", 0, 4), ("start", 1, 4)]


def test_the_closer_runs_after_the_end_hooks_of_every_closed_epoch() -> None:
    clock, trace = _clock(2)
    closes: list[Any] = []
    clock.set_closer(lambda: closes.append(len(trace)))
    _train(clock, 4)
    assert closes == [4, 8]  # each after both end hooks of its epoch
    clock.begin_pass(2, 0)  # no close when none is open
    clock.begin_pass(3, 0)  # an epoch still open is closed first, the closer too
    assert closes == [4, 8, 12] and clock.epochs_trained == 3


def test_a_clock_without_callbacks_only_counts() -> None:
    clock = Clock(HookRunner({}))
    clock.start(2)
    _train(clock, 5)
    assert (clock.batches_trained, clock.epochs_trained, clock.open_epoch) == (5, 2, 2)


def test_without_an_epoch_length_there_are_no_epochs() -> None:
    clock, trace = _clock(None)
    assert clock.begin(5) == (0, 0, 5)  # Keras over data without a length: batch in epoch = batches trained
    clock.advance(5)
    assert clock.begin(3) == (0, 5, 3)
    clock.advance(3)
    assert trace == [] and (clock.batches_trained, clock.epochs_trained, clock.open_epoch) == (8, 0, None)
