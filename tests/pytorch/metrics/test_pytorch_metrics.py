"""Training and validation metric accumulation: averages, element-wise non-scalars, simulated
ranks, errors, and no device-to-host sync while batches are added."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from support.helpers_sim_ranks import SimulatedRanks, reduce_one

from determined_trials.loop import reduce_across_ranks
from determined_trials.pytorch import Reducer
from determined_trials.pytorch.metrics._metrics import TrainingMetrics, ValidationMetrics
from determined_trials.pytorch.metrics._reducer import ReducerRegistry


def _ranks(metrics: list[Any]) -> list[dict[str, Any]]:
    """The adapters' reduction on every simulated rank, each rank holding one of ``metrics``."""
    sim = SimulatedRanks(len(metrics))
    results = sim.run([lambda dist, m=m: reduce_across_ranks(dist, m, ReducerRegistry(), True)[0] for m in metrics])
    assert sim.collectives == [1] * len(metrics)  # one allgather per rank
    return results


# --- training ----------------------------------------------------------------------------------

def test_tensor_output_is_the_loss_averaged_over_batches() -> None:
    metrics = TrainingMetrics()
    for loss in (1.0, 2.0, 4.5):
        metrics.add(torch.tensor(loss, requires_grad=True) * 1)
    assert metrics.num_batches == 3
    result = reduce_one(metrics)
    assert result == {"loss": pytest.approx(2.5)} and type(result["loss"]) is float
    assert metrics.total_batches == 3


def test_dict_of_tensors_numbers_and_numpy() -> None:
    metrics = TrainingMetrics()
    metrics.add({"loss": torch.tensor(1.0), "n": 3, "acc": np.float32(0.5), "hit": torch.tensor(True),
                 "f": 0.25, "np0": np.array(2.0), "lr": torch.tensor(0.1, dtype=torch.bfloat16)})
    metrics.add({"loss": torch.tensor(3.0), "n": 4, "acc": np.float32(1.0), "hit": torch.tensor(False),
                 "f": 0.75, "np0": np.array(4), "lr": torch.tensor(0.1, dtype=torch.bfloat16)})
    result = reduce_one(metrics)
    assert result["loss"] == 2.0 and result["n"] == 3.5 and result["acc"] == 0.75
    assert result["hit"] == 0.5 and result["f"] == 0.5 and result["np0"] == 3.0
    assert result["lr"] == pytest.approx(0.1, rel=1e-2)
    assert all(type(v) is float for v in result.values())


def test_mixed_kinds_for_one_key() -> None:
    metrics = TrainingMetrics()
    for value in (torch.tensor(1.0), 2.0, np.float64(3.0), np.array(6.0)):
        metrics.add({"x": value})
    assert reduce_one(metrics) == {"x": 3.0}


def test_non_scalars_are_averaged_element_wise() -> None:
    metrics = TrainingMetrics()
    metrics.add({"m": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "v": np.array([1, 2, 3])})
    metrics.add({"m": torch.tensor([[3.0, 4.0], [5.0, 8.0]]), "v": np.array([3, 2, 1])})
    assert reduce_one(metrics) == {"m": [[2.0, 3.0], [4.0, 6.0]], "v": [2.0, 2.0, 2.0]}


def test_large_non_scalars_are_folded_as_they_come() -> None:
    metrics = TrainingMetrics()
    for i in range(3):
        metrics.add({"big": torch.full((300, 300), float(i))})
    assert np.allclose(reduce_one(metrics)["big"], 1.0)


def test_many_batches_fold_and_stay_exact() -> None:
    metrics = TrainingMetrics()
    for i in range(2500):
        metrics.add({"i": torch.tensor(float(i)), "k": i})
    assert reduce_one(metrics) == {"i": 1249.5, "k": 1249.5}


def test_two_ranks_weighted_by_batch_count() -> None:
    losses = [[1.0, 2.0, 3.0], [10.0]]
    ranks = [TrainingMetrics(), TrainingMetrics(), TrainingMetrics()]  # rank 2 trains 0 batches
    for metrics, values in zip(ranks, losses):
        for v in values:
            metrics.add({"loss": torch.tensor(v), "vec": torch.tensor([v, -v])})
    results = _ranks(ranks)
    assert results[0] == {"loss": 4.0, "vec": [4.0, -4.0]}
    assert results[0] == results[1] == results[2]
    assert ranks[2].total_batches == 4


def test_no_batches_anywhere_gives_no_metrics() -> None:
    assert _ranks([TrainingMetrics(), TrainingMetrics()]) == [{}, {}]


def test_one_allgather_per_reduction_and_reset() -> None:
    metrics = TrainingMetrics()
    metrics.add(torch.tensor(1.0))
    assert _ranks([metrics, TrainingMetrics()]) == [{"loss": 1.0}] * 2  # one allgather each, checked there
    metrics.reset()
    assert metrics.num_batches == 0
    metrics.add({"other": 2})  # new workload, new names
    assert reduce_one(metrics) == {"other": 2.0}


def test_ranks_with_different_names_or_shapes() -> None:
    a, b = TrainingMetrics(), TrainingMetrics()
    a.add({"x": 1.0})
    b.add({"y": 1.0})
    with pytest.raises(ValueError, match="ranks report different metric names"):
        _ranks([a, b])
    a, b = TrainingMetrics(), TrainingMetrics()
    a.add({"x": torch.zeros(2)})
    b.add({"x": torch.zeros(3)})
    with pytest.raises(ValueError, match="metric 'x' has shape \\[2\\] on rank 0 but \\[3\\]"):
        _ranks([a, b])


@pytest.mark.parametrize(("outputs", "error", "match"), [
    ([{"x": torch.zeros(2)}, {"x": torch.zeros(3)}], ValueError, "metric 'x' has shape \\[3\\]"),
    ([{"x": 1.0}, {"x": np.zeros(2)}], ValueError, "metric 'x' has shape \\[2\\]"),
    ([{"a": 1.0}, {"b": 1.0}], ValueError, "missing \\['a'\\], unexpected \\['b'\\]"),
    ([{"a": 1.0}, {"a": 1.0, "b": 2.0}], ValueError, "same metric names for every batch"),
    ([{"name": "resnet"}], TypeError, "metric 'name' is a builtins.str"),
    ([{"a": 1.0}, {"a": None}], TypeError, "metric 'a' is a builtins.NoneType"),
    ([{"s": np.array(["x"])}], TypeError, "metric 's' is a numpy.ndarray"),
    ([{1: 1.0}], TypeError, "metric names must be strings"),
    ([[torch.tensor(1.0)]], TypeError, "tensor \\(the loss\\) or a dict of metrics, got list"),
])
def test_training_errors(outputs: list[Any], error: type, match: str) -> None:
    metrics = TrainingMetrics()
    with pytest.raises(error, match=match):
        for output in outputs:
            metrics.add(output)


def test_complex_tensor_is_rejected_at_the_boundary() -> None:
    metrics = TrainingMetrics()
    metrics.add({"z": torch.tensor(1 + 2j)})
    with pytest.raises(TypeError, match="'z' is a complex tensor"):
        reduce_one(metrics)


# --- no host sync while adding -------------------------------------------------------------------

@pytest.fixture
def no_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("device-to-host transfer during add()")

    for name in ("item", "cpu", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)


@pytest.mark.usefixtures("no_host_sync")
def test_add_performs_no_host_transfer() -> None:
    train, val = TrainingMetrics(), ValidationMetrics({"loss": Reducer.AVG, "n": Reducer.SUM})
    for i in range(1100):  # past the fold threshold: folding must not sync either
        loss = torch.tensor(float(i), requires_grad=True) * 2
        train.add({"loss": loss, "n": torch.tensor(i)})
        val.add({"loss": loss, "n": torch.tensor(i)}, 32)
    big_train, big_val = TrainingMetrics(), ValidationMetrics(Reducer.MAX)
    for _ in range(3):  # folded at every batch
        big_train.add({"big": torch.ones(70_000)})
        big_val.add({"big": torch.ones(70_000)}, 4)
    with pytest.raises(AssertionError, match="device-to-host"):
        torch.tensor(1.0).item()


def test_add_then_finish_after_sync_guard() -> None:
    metrics = TrainingMetrics()
    metrics.add(torch.tensor(2.0))
    assert reduce_one(metrics) == {"loss": 2.0}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_add_never_synchronises() -> None:
    train, val = TrainingMetrics(), ValidationMetrics(Reducer.AVG)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(1100):
            value = torch.full((3,), float(i), device="cuda")
            train.add({"loss": value.sum(), "vec": value, "n": 1.0})
            val.add({"loss": value.sum(), "vec": value}, 2 + i % 3)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert reduce_one(train)["vec"] == [549.5] * 3
    expected = sum(i * (2 + i % 3) for i in range(1100)) / sum(2 + i % 3 for i in range(1100))
    assert reduce_one(val)["vec"] == pytest.approx([expected] * 3)


# --- validation ----------------------------------------------------------------------------------

def _batches() -> list[tuple[dict[str, Any], int]]:
    rng = np.random.default_rng(0)
    out = []
    for records in (32, 32, 32, 7, 32, 13, 5):
        out.append(({"loss": torch.tensor(rng.random()), "correct": int(rng.integers(0, records)),
                     "peak": torch.tensor(rng.random()), "low": rng.random(),
                     "per_class": torch.tensor(rng.random(3))}, records))
    return out


REDUCERS = {"loss": Reducer.AVG, "correct": Reducer.SUM, "peak": Reducer.MAX, "low": Reducer.MIN,
            "per_class": Reducer.AVG}


def test_validation_across_ranks_equals_single_process() -> None:
    batches = _batches()
    single = ValidationMetrics(REDUCERS)
    for output, count in batches:
        single.add(output, count)
    expected = reduce_one(single)
    records = [r for _, r in batches]
    assert expected["loss"] == pytest.approx(
        sum(float(o["loss"]) * r for o, r in batches) / sum(records))
    assert expected["correct"] == sum(o["correct"] for o, _ in batches)
    assert type(expected["correct"]) is int
    assert expected["peak"] == pytest.approx(max(float(o["peak"]) for o, _ in batches))
    assert expected["low"] == min(o["low"] for o, _ in batches)
    assert len(expected["per_class"]) == 3

    ranks = [ValidationMetrics(REDUCERS) for _ in range(3)]  # rank 2 gets no batch at all
    for i, (output, count) in enumerate(batches):
        ranks[0 if i < 5 else 1].add(output, count)  # unequal record counts per rank
    for result in _ranks(ranks):
        assert result.keys() == expected.keys()
        for key, value in expected.items():
            assert result[key] == pytest.approx(value)
    assert ranks[0].total_records == sum(records)


def test_validation_non_scalar_element_wise() -> None:
    for reducer, expected in ((Reducer.AVG, [2.75, 1.5]), (Reducer.SUM, [8.0, 4.0]),
                              (Reducer.MAX, [4.0, 3.0]), (Reducer.MIN, [1.0, -1.0])):
        metrics = ValidationMetrics(reducer)
        metrics.add({"v": torch.tensor([1.0, 3.0])}, 1)
        metrics.add({"v": torch.tensor([4.0, -1.0])}, 1)
        metrics.add({"v": np.array([3.0, 2.0])}, 2)
        assert reduce_one(metrics) == {"v": pytest.approx(expected)}, reducer


def test_validation_integer_extremes_stay_integers() -> None:
    metrics = ValidationMetrics(Reducer.MAX)
    metrics.add({"t": torch.tensor(3), "p": 7}, 4)
    metrics.add({"t": torch.tensor(9), "p": 2}, 4)
    result = reduce_one(metrics)
    assert result == {"t": 9, "p": 7} and all(type(v) is int for v in result.values())


@pytest.mark.parametrize(("reducer", "error", "match"), [
    ("avg", TypeError, "must return a Reducer"),
    ({"loss": "avg"}, TypeError, "dict of metric name -> Reducer"),
    ({"loss": Reducer.AVG}, ValueError, "reducers for \\['loss'\\] but evaluate_batch returned "
                                        "metrics \\['acc', 'loss'\\]"),
])
def test_evaluation_reducer_errors(reducer: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ValidationMetrics(reducer).add({"loss": 1.0, "acc": 0.5}, 1)


@pytest.mark.parametrize(("outputs", "error", "match"), [
    ([({"a": 1.0}, 1), ({"b": 1.0}, 1)], ValueError, "evaluate_batch must return the same"),
    ([(torch.tensor(1.0), 1)], TypeError, "evaluate_batch must return a dict"),
    ([({"a": 1.0}, 1.5)], TypeError, "record count of a batch must be an int"),
    ([({"a": 1.0}, torch.tensor(3))], TypeError, "record count of a batch must be an int"),
    ([({"a": 1.0}, -1)], ValueError, "cannot hold -1 records"),
    ([({"a": "text"}, 1)], TypeError, "metric 'a' is a builtins.str"),
])
def test_validation_errors(outputs: list[Any], error: type, match: str) -> None:
    metrics = ValidationMetrics()
    with pytest.raises(error, match=match):
        for output, records in outputs:
            metrics.add(output, records)


def test_no_validation_batches_on_any_rank() -> None:
    with pytest.raises(RuntimeError, match="the validation data loader yielded no batches"):
        _ranks([ValidationMetrics(), ValidationMetrics()])


def test_zero_records_cannot_be_averaged() -> None:
    metrics = ValidationMetrics(Reducer.AVG)
    metrics.add({"x": 1.0}, 0)
    with pytest.raises(ValueError, match="every batch counted 0 records"):
        reduce_one(metrics)


def test_zero_record_batch_does_not_move_the_average() -> None:
    metrics = ValidationMetrics(Reducer.AVG)
    metrics.add({"x": torch.tensor(2.0)}, 10)
    metrics.add({"x": torch.tensor(100.0)}, 0)
    assert reduce_one(metrics) == {"x": 2.0}


# --- the adapters' cross-rank step: metrics, reducers and extras in one allgather ------------------

def test_reduction_with_reducers_and_extras_is_one_allgather_per_rank() -> None:
    sim = SimulatedRanks(2)
    metrics = [TrainingMetrics(), TrainingMetrics()]
    registries = [ReducerRegistry(), ReducerRegistry()]
    for rank, (m, reg) in enumerate(zip(metrics, registries)):
        m.add({"loss": torch.tensor(float(rank + 1))})
        reg.wrap(sum, name="total").update(10 * (rank + 1))  # type: ignore[attr-defined]

    def body(rank: int) -> Any:
        return lambda dist: reduce_across_ranks(dist, metrics[rank], registries[rank], True, extra=f"rank {rank}")

    results = sim.run([body(0), body(1)])
    assert results == [({"loss": 1.5, "total": 30}, ["rank 0", "rank 1"])] * 2
    assert sim.collectives == [1, 1]


def test_ranks_that_do_not_report_are_left_out() -> None:
    sim = SimulatedRanks(3)  # rank 1 is e.g. a pipeline stage whose MPU does not report metrics
    metrics = [ValidationMetrics(Reducer.SUM) for _ in range(3)]
    registries = [ReducerRegistry() for _ in range(3)]
    for rank in range(3):
        metrics[rank].add({"n": 1 + rank}, 2)
        registries[rank].wrap(lambda values: sorted(values), name="seen").update(rank)  # type: ignore[attr-defined]

    def body(rank: int) -> Any:
        return lambda dist: reduce_across_ranks(dist, metrics[rank], registries[rank], False, reports=rank != 1)[0]

    assert sim.run([body(r) for r in range(3)]) == [{"n": 4, "seen": [0, 2]}] * 3
    assert metrics[1].total_records == 4 and sim.collectives == [1, 1, 1]


def test_training_with_no_reporting_rank_gives_no_metrics() -> None:
    sim = SimulatedRanks(2)
    registries = [ReducerRegistry(), ReducerRegistry()]
    for reg in registries:
        reg.wrap(sum, name="total")
    body = [lambda dist, reg=reg: reduce_across_ranks(dist, TrainingMetrics(), reg, True, reports=False)
            for reg in registries]
    assert sim.run(body) == [({}, [])] * 2  # the reducers are not asked to reduce nothing
