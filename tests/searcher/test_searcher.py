"""SearcherContext: operations, completion rules, progress, units and modes."""

from __future__ import annotations

from typing import Any

import pytest

from determined_trials.core import SearcherContext, SearcherMode, Unit
from determined_trials.core._searcher import SingleOperationSource


class _FakeDist:
    def __init__(self, rank: int = 0, size: int = 1) -> None:
        self.rank, self.size = rank, size

    def get_rank(self) -> int:
        return self.rank

    def get_size(self) -> int:
        return self.size

    def broadcast(self, stuff: Any = None) -> Any:
        return 5 if self.rank else stuff


class _Recorder:
    def __init__(self) -> None:
        self.ops: list[tuple[int, float | None, bool]] = []
        self.progress: list[float] = []

    def record_searcher_op(self, trial_id: int, length: int, metric: float | None, completed: bool) -> None:
        self.ops.append((length, metric, completed))

    def set_trial_progress(self, trial_id: int, progress: float) -> None:
        self.progress.append(progress)


class _Rungs:
    """A source of several absolute lengths (like ASHA rungs), recording what completed."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = list(lengths)
        self.done: list[tuple[int, float]] = []

    def next_length(self) -> int | None:
        return self.lengths.pop(0) if self.lengths else None

    def completed(self, length: int, metric: float) -> None:
        self.done.append((length, metric))


def _context(source: Any, rank: int = 0, size: int = 1, recorder: Any = None) -> SearcherContext:
    return SearcherContext(_FakeDist(rank, size), source=source, trial_id=1,  # type: ignore[arg-type]
                           store=recorder or _Recorder(), units=Unit.EPOCHS, max_length=10)


def test_single_operation_with_progress_and_completion() -> None:
    recorder = _Recorder()
    ctx = _context(SingleOperationSource(10), recorder=recorder)
    lengths = []
    for op in ctx.operations():
        lengths.append(op.length)
        op.report_progress(5)
        op.report_completed(0.25)
    assert lengths == [10]
    assert recorder.progress == [0.5]
    assert recorder.ops == [(10, 0.25, True)]
    assert ctx.get_configured_units() is Unit.EPOCHS


def test_absolute_lengths_and_metrics_reach_the_source() -> None:
    source = _Rungs([2, 8, 32])
    for op in _context(source).operations():
        op.report_completed(float(op.length) / 10)
    assert source.done == [(2, 0.2), (8, 0.8), (32, 3.2)]


def test_missing_report_completed_is_an_error() -> None:
    ops = _context(_Rungs([2, 4])).operations()
    next(ops)
    with pytest.raises(RuntimeError, match="without op.report_completed"):
        next(ops)


def test_report_completed_twice_and_bad_metrics() -> None:
    op = next(_context(SingleOperationSource(3)).operations())
    with pytest.raises(TypeError, match="must be a number"):
        op.report_completed("good")
    with pytest.raises(ValueError, match="NaN"):
        op.report_completed(float("nan"))
    op.report_completed(1)
    with pytest.raises(RuntimeError, match="already called"):
        op.report_completed(2)


def test_workers_get_the_chief_operation_but_may_not_complete() -> None:
    worker = _context(SingleOperationSource(99), rank=1, size=2)
    ops = worker.operations()
    op = next(ops)
    assert op.length == 5  # the fake broadcast hands workers the chief's length
    with pytest.raises(RuntimeError, match="only the chief"):
        op.report_completed(1.0)


def test_chief_only_mode_refuses_workers() -> None:
    with pytest.raises(RuntimeError, match="ChiefOnly"):
        next(_context(SingleOperationSource(1), rank=1, size=2).operations(SearcherMode.ChiefOnly))


def test_unit_from_name() -> None:
    assert Unit.from_name("batches") is Unit.BATCHES
    assert Unit.from_name(None) is None
