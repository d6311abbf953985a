"""Reducer enum results, wrapped reducers (functions and MetricReducers) over simulated ranks, and
the naming and wrapping errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from support.helpers_sim_ranks import reduce_one

from determined_trials.pytorch import MetricReducer, Reducer
from determined_trials.pytorch.metrics._metrics import ValidationMetrics
from determined_trials.pytorch.metrics._reducer import ReducerRegistry

VALUES = [0.25, 0.5, 0.75, 1, 25.5, 1.9]
WEIGHTS = [1, 2, 5, 4, 5, 6]


def _single(allgathered: Any) -> list[Any]:
    return [allgathered]


def test_enum_numbers() -> None:
    assert [(r.name, r.value) for r in Reducer] == [("AVG", 1), ("SUM", 2), ("MAX", 3), ("MIN", 4)]


@pytest.mark.parametrize(("reducer", "expected"), [
    (Reducer.AVG, 4.98), (Reducer.SUM, 29.9), (Reducer.MIN, 0.25), (Reducer.MAX, 25.5),
])
def test_reference_numbers(reducer: Reducer, expected: float) -> None:
    metrics = ValidationMetrics(reducer)
    for value in VALUES:
        metrics.add({"x": torch.tensor(value)}, 1)
    assert round(reduce_one(metrics, training=False)["x"], 2) == expected


def test_reference_weighted_average() -> None:
    metrics = ValidationMetrics(Reducer.AVG)
    for value, weight in zip(VALUES, WEIGHTS):
        metrics.add({"x": value}, weight)
    assert round(reduce_one(metrics, training=False)["x"], 2) == 6.43
    assert metrics.total_records == sum(WEIGHTS)


# --- simulated ranks -----------------------------------------------------------------------------

def _reduce_ranks(registries: list[ReducerRegistry], training: bool) -> list[dict[str, Any]]:
    """Reduce on every simulated rank with a fake allgather returning every rank's payload."""
    payloads = [reg.per_slot(training) for reg in registries]
    calls: list[int] = []

    def allgather_for(rank: int) -> Any:
        def allgather(mine: Any) -> list[Any]:
            calls.append(rank)
            assert mine == payloads[rank]
            return payloads
        return allgather

    results = [reg.reduce(training, allgather_for(rank)) for rank, reg in enumerate(registries)]
    assert calls == list(range(len(registries)))  # one allgather per rank
    return results


class _Accuracy(MetricReducer):
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.correct = 0
        self.total = 0

    def update(self, correct: int, total: int) -> None:
        self.correct += correct
        self.total += total

    def per_slot_reduce(self) -> tuple[int, int]:
        return self.correct, self.total

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
        correct = sum(c for c, _ in per_slot_metrics)
        total = sum(t for _, t in per_slot_metrics)
        return {"accuracy": correct / total, "seen": torch.tensor(total)}


def test_function_reducer_receives_every_update_in_global_order() -> None:
    # 4 global batches of 4 items; rank r holds items [2r, 2r+1] of each batch.
    seen: list[list[int]] = []

    def collect(values: list[int]) -> int:
        seen.append(list(values))
        return len(values)

    registries = [ReducerRegistry(), ReducerRegistry()]
    reducers = [reg.wrap(collect, name="n") for reg in registries]
    for batch in range(4):
        for rank, reducer in enumerate(reducers):
            for item in range(4 * batch + 2 * rank, 4 * batch + 2 * rank + 2):
                reducer.update(item)  # type: ignore[attr-defined]
            registries[rank].batch_end()
    results = _reduce_ranks(registries, training=True)
    assert results == [{"n": 16}, {"n": 16}]
    assert seen == [list(range(16))] * 2


def test_function_reducer_without_batch_marks_interleaves_round_robin() -> None:
    registries = [ReducerRegistry(), ReducerRegistry()]
    reducers = [reg.wrap(lambda values: list(values), name="order") for reg in registries]
    for batch in range(3):  # rank 1 has one batch fewer (uneven validation shard)
        for rank, reducer in enumerate(reducers):
            if rank == 0 or batch < 2:
                reducer.update(2 * batch + rank)  # type: ignore[attr-defined]
    results = _reduce_ranks(registries, training=False)
    assert results[0] == {"order": [0, 1, 2, 3, 4]} == results[1]


def test_metric_reducer_training_and_validation_two_ranks() -> None:
    registries = [ReducerRegistry(), ReducerRegistry()]
    accs = [reg.wrap(_Accuracy()) for reg in registries]
    train_only = [reg.wrap(sum, name="train_sum", for_validation=False) for reg in registries]
    for reg in registries:
        reg.reset(training=True)
    accs[0].update(3, 4)  # type: ignore[attr-defined]
    accs[1].update(1, 4)  # type: ignore[attr-defined]
    train_only[0].update(torch.tensor(2.0))  # type: ignore[attr-defined]
    train_only[1].update(torch.tensor(5.0))  # type: ignore[attr-defined]
    results = _reduce_ranks(registries, training=True)
    assert results[0] == {"accuracy": 0.5, "seen": 8, "train_sum": 7.0} == results[1]
    assert type(results[0]["seen"]) is int and type(results[0]["train_sum"]) is float

    for reg in registries:
        reg.reset(training=False)
    accs[0].update(9, 10)  # type: ignore[attr-defined]
    results = _reduce_ranks(registries, training=False)
    assert results == [{"accuracy": 0.9, "seen": 10}] * 2
    assert registries[0].has_reducers(False) and registries[0].has_reducers(True)


def test_validation_reset_leaves_training_only_reducers_alone() -> None:
    registry = ReducerRegistry()
    train_only = registry.wrap(lambda v: sum(v), name="s", for_validation=False)
    train_only.update(1)  # type: ignore[attr-defined]
    registry.reset(training=False)
    assert registry.reduce(True, _single) == {"s": 1}
    registry.reset(training=True)
    assert registry.reduce(True, _single) == {"s": 0}


def test_results_become_python_values() -> None:
    registry = ReducerRegistry()
    registry.wrap(lambda v: {"vec": torch.arange(3), "arr": np.ones((2, 2)), "np": np.float32(1.5),
                             "pair": (torch.tensor(1.0), 2)})
    assert registry.reduce(False, _single) == {
        "vec": [0, 1, 2], "arr": [[1.0, 1.0], [1.0, 1.0]], "np": 1.5, "pair": [1.0, 2]}


def test_no_reducers_means_no_collective() -> None:
    registry = ReducerRegistry()
    registry.wrap(lambda v: 0, name="t", for_validation=False)

    def fail(_: Any) -> list[Any]:
        raise AssertionError("allgather must not run")

    assert registry.reduce(False, fail) == {}
    assert not registry.has_reducers(False)


def test_ranks_with_different_reducers_are_reported() -> None:
    registry = ReducerRegistry()
    registry.wrap(sum, name="s")
    with pytest.raises(ValueError, match="rank 1 sent 2 reducer results"):
        registry.cross_slot(True, [[([], [])], [([], []), ([], [])]])


# --- naming and wrapping errors ----------------------------------------------------------------

def test_unnamed_reducer_must_return_a_dict() -> None:
    registry = ReducerRegistry()
    registry.wrap(sum)
    with pytest.raises(TypeError, match="name=None but returned int"):
        registry.reduce(True, _single)


def test_named_reducer_must_not_return_a_dict() -> None:
    registry = ReducerRegistry()
    registry.wrap(lambda v: {"a": 1}, name="a")
    with pytest.raises(TypeError, match="wrapped with name set but returned a dict"):
        registry.reduce(True, _single)


def test_unnamed_reducer_keys_must_be_strings() -> None:
    registry = ReducerRegistry()
    registry.wrap(lambda v: {1: 2})
    with pytest.raises(TypeError, match="non-string key 1"):
        registry.reduce(True, _single)


def test_same_metric_from_two_reducers() -> None:
    registry = ReducerRegistry()
    registry.wrap(lambda v: {"m": 1})
    registry.wrap(lambda v: 2, name="m")
    with pytest.raises(ValueError, match="metric 'm' is produced by both"):
        registry.reduce(True, _single)


def test_wrap_errors() -> None:
    registry = ReducerRegistry()
    acc = _Accuracy()
    registry.wrap(acc, name="acc")
    registry.wrap(sum, name="total")
    with pytest.raises(ValueError, match="already wrapped"):
        registry.wrap(acc)
    with pytest.raises(ValueError, match="already wrapped"):
        registry.wrap(sum, name="other")
    with pytest.raises(ValueError, match="two reducers are named 'acc'"):
        registry.wrap(max, name="acc")
    with pytest.raises(TypeError, match="MetricReducer instance or a function"):
        registry.wrap(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pass an instance"):
        registry.wrap(_Accuracy)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="non-empty string"):
        registry.wrap(min, name="")
    with pytest.raises(TypeError, match="for_training must be True or False"):
        registry.wrap(min, name="m", for_training=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="never be reduced"):
        registry.wrap(min, name="m", for_training=False, for_validation=False)


def test_user_errors_name_the_reducer() -> None:
    def broken(values: list[Any]) -> float:
        return 1 / len(values)

    registry = ReducerRegistry()
    registry.wrap(broken, name="ratio")
    with pytest.raises(RuntimeError, match=r"'.*broken' \(name='ratio'\) raised in "
                                           r"cross_slot_reduce\(\): ZeroDivisionError") as info:
        registry.reduce(True, _single)
    assert isinstance(info.value.__cause__, ZeroDivisionError)

    class BadReset(_Accuracy):
        def reset(self) -> None:
            raise KeyError("boom")

    registry = ReducerRegistry()
    bad = BadReset.__new__(BadReset)
    registry.wrap(bad)
    with pytest.raises(RuntimeError, match=r"MetricReducer .*BadReset \(name=None\) raised in reset"):
        registry.reset(training=True)
