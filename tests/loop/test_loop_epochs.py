"""The epoch cursor every adapter steps: opening and closing epochs, the epoch hooks' order and
arguments, the batch and epoch counts, resuming mid-epoch and a raw loader's short pass."""

from __future__ import annotations

from typing import Any

from determined_trials.loop import EpochCursor, HookRunner, TrialState


class _Recorder:
    """A callback that records the epoch hooks it sees, with the counts at that moment."""

    def __init__(self, trace: list[Any], state: TrialState) -> None:
        self.trace, self.state = trace, state

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.trace.append(("start", epoch_idx, self.state.batches_trained, self.state.epochs_trained))

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.trace.append(("end", epoch_idx, self.state.batches_trained, self.state.epochs_trained))


def _cursor(state: TrialState, on_close: Any = None) -> tuple[EpochCursor, list[Any]]:
    trace: list[Any] = []
    hooks = HookRunner({"first": _Recorder(trace, state), "second": _Recorder(trace, state)})
    return EpochCursor(hooks, on_close=on_close), trace


def _train(cursor: EpochCursor, state: TrialState, batches: int, epoch_len: int) -> None:
    """A per-batch adapter over a stream of known length (DeepSpeed, Keras, a det DataLoader)."""
    for _ in range(batches):
        epoch_idx, in_epoch = divmod(state.batches_trained, epoch_len)
        cursor.enter(epoch_idx, in_epoch, state)
        cursor.advance(state, 1, in_epoch + 1 == epoch_len)


def test_epochs_open_and_close_around_their_batches_in_callback_order() -> None:
    state = TrialState()
    cursor, trace = _cursor(state)
    _train(cursor, state, 7, epoch_len=3)
    assert trace == [
        ("start", 0, 0, 0), ("start", 0, 0, 0),  # both callbacks, in registration order
        ("end", 0, 3, 0), ("end", 0, 3, 0),      # after the epoch's last batch is counted, before the epoch
        ("start", 1, 3, 1), ("start", 1, 3, 1),
        ("end", 1, 6, 1), ("end", 1, 6, 1),
        ("start", 2, 6, 2), ("start", 2, 6, 2),
    ]
    assert (state.batches_trained, state.epochs_trained, cursor.current) == (7, 2, 2)


def test_a_run_of_batches_counts_them_once_and_closes_at_the_epoch_end() -> None:
    # The PyTorch tight loop: one enter per run within an epoch, one advance, close at the last batch.
    state = TrialState()
    cursor, trace = _cursor(state)
    for run in (2, 2, 3):
        first = state.batches_trained
        epoch_idx, in_epoch = divmod(first, 4)
        cursor.enter(epoch_idx, in_epoch, state)
        cursor.advance(state, run)
        if in_epoch + run == 4:
            cursor.close(state)
    assert [t[:2] for t in trace[::2]] == [("start", 0), ("end", 0), ("start", 1)]
    assert (state.batches_trained, state.epochs_trained, cursor.current) == (7, 1, 1)


def test_resumed_mid_epoch_adopts_the_open_epoch_without_a_second_start() -> None:
    state = TrialState(batches_trained=4, epochs_trained=1)  # a checkpoint taken after batch 0 of epoch 1
    cursor, trace = _cursor(state)
    _train(cursor, state, 1, epoch_len=3)
    assert cursor.current == 1 and trace == []  # its start hook ran before the stop
    _train(cursor, state, 2, epoch_len=3)
    assert [t[:2] for t in trace[::2]] == [("end", 1), ("start", 2)]
    assert (state.batches_trained, state.epochs_trained) == (7, 2)


def test_resumed_at_an_epoch_boundary_opens_the_next_epoch() -> None:
    state = TrialState(batches_trained=6, epochs_trained=2)
    cursor, trace = _cursor(state)
    _train(cursor, state, 1, epoch_len=3)
    assert [t[:2] for t in trace[::2]] == [("start", 2)] and state.epochs_trained == 2


def test_a_raw_loaders_short_pass_is_closed_when_the_next_begins() -> None:
    # A raw loader's passes decide the epochs: 3 batches, then a pass that ends after 2 (len says 3).
    state = TrialState()
    cursor, trace = _cursor(state)
    for epoch_idx, in_epoch in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)]:
        cursor.enter(epoch_idx, in_epoch, state)
        cursor.advance(state, 1, in_epoch + 1 == 3)
    assert [t[:3] for t in trace[::2]] == [
        ("start", 0, 0), ("end", 0, 3), ("start", 1, 3),
        ("end", 1, 5), ("start", 2, 5),  # the short pass 1 ends as pass 2 begins, before its start hook
    ]
    assert (state.batches_trained, state.epochs_trained, cursor.current) == (6, 2, 2)


def test_on_close_runs_after_the_end_hooks_of_every_closed_epoch() -> None:
    state = TrialState()
    closes: list[Any] = []
    cursor, trace = _cursor(state, on_close=lambda: closes.append(len(trace)))
    _train(cursor, state, 4, epoch_len=2)
    assert closes == [4, 8]  # each after both end hooks of its epoch
    cursor.open(2, state)  # no close when none is open
    cursor.open(3, state)  # an epoch still open is closed first, on_close too
    assert closes == [4, 8, 12] and state.epochs_trained == 3


def test_a_cursor_without_callbacks_only_counts() -> None:
    state = TrialState()
    cursor = EpochCursor(HookRunner({}))
    _train(cursor, state, 5, epoch_len=2)
    assert (state.batches_trained, state.epochs_trained, cursor.current) == (5, 2, 2)
