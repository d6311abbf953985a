"""Training and validation metric accumulation: averages, element-wise non-scalars, simulated
ranks, errors, and no device-to-host sync while batches are added."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from determined_trials.pytorch import Reducer
from determined_trials.pytorch._metrics import TrainingMetrics, ValidationMetrics


def _single(x: Any) -> list[Any]:
    return [x]


def _ranks(metrics: list[Any]) -> list[dict[str, Any]]:
    """finish() on every simulated rank with a fake allgather that returns all summaries."""
    summaries = [m.summary() for m in metrics]
    return [m.finish(lambda mine: summaries) for m in metrics]


# --- training ----------------------------------------------------------------------------------

def test_tensor_output_is_the_loss_averaged_over_batches() -> None:
    metrics = TrainingMetrics()
    for loss in (1.0, 2.0, 4.5):
        metrics.add(torch.tensor(loss, requires_grad=True) * 1)
    assert metrics.num_batches == 3
    result = metrics.finish(_single)
    assert result == {"loss": pytest.approx(2.5)} and type(result["loss"]) is float
    assert metrics.total_batches == 3


def test_dict_of_tensors_numbers_and_numpy() -> None:
    metrics = TrainingMetrics()
    metrics.add({"loss": torch.tensor(1.0), "n": 3, "acc": np.float32(0.5), "hit": torch.tensor(True),
                 "f": 0.25, "np0": np.array(2.0), "lr": torch.tensor(0.1, dtype=torch.bfloat16)})
    metrics.add({"loss": torch.tensor(3.0), "n": 4, "acc": np.float32(1.0), "hit": torch.tensor(False),
                 "f": 0.75, "np0": np.array(4), "lr": torch.tensor(0.1, dtype=torch.bfloat16)})
    result = metrics.finish(_single)
    assert result["loss"] == 2.0 and result["n"] == 3.5 and result["acc"] == 0.75
    assert result["hit"] == 0.5 and result["f"] == 0.5 and result["np0"] == 3.0
    assert result["lr"] == pytest.approx(0.1, rel=1e-2)
    assert all(type(v) is float for v in result.values())


def test_mixed_kinds_for_one_key() -> None:
    metrics = TrainingMetrics()
    for value in (torch.tensor(1.0), 2.0, np.float64(3.0), np.array(6.0)):
        metrics.add({"x": value})
    assert metrics.finish(_single) == {"x": 3.0}


def test_non_scalars_are_averaged_element_wise() -> None:
    metrics = TrainingMetrics()
    metrics.add({"m": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "v": np.array([1, 2, 3])})
    metrics.add({"m": torch.tensor([[3.0, 4.0], [5.0, 8.0]]), "v": np.array([3, 2, 1])})
    assert metrics.finish(_single) == {"m": [[2.0, 3.0], [4.0, 6.0]], "v": [2.0, 2.0, 2.0]}


def test_large_non_scalars_are_folded_as_they_come() -> None:
    metrics = TrainingMetrics()
    for i in range(3):
        metrics.add({"big": torch.full((300, 300), float(i))})
    assert np.allclose(metrics.finish(_single)["big"], 1.0)


def test_many_batches_fold_and_stay_exact() -> None:
    metrics = TrainingMetrics()
    for i in range(2500):
        metrics.add({"i": torch.tensor(float(i)), "k": i})
    assert metrics.finish(_single) == {"i": 1249.5, "k": 1249.5}


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


def test_one_allgather_per_finish_and_reset() -> None:
    metrics = TrainingMetrics()
    metrics.add(torch.tensor(1.0))
    calls: list[Any] = []

    def allgather(x: Any) -> list[Any]:
        calls.append(x)
        return [x]

    assert metrics.finish(allgather) == {"loss": 1.0}
    assert len(calls) == 1
    metrics.reset()
    assert metrics.num_batches == 0
    metrics.add({"other": 2})  # new workload, new names
    assert metrics.finish(_single) == {"other": 2.0}


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
        metrics.finish(_single)


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
    assert metrics.finish(_single) == {"loss": 2.0}


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
    assert train.finish(_single)["vec"] == [549.5] * 3
    expected = sum(i * (2 + i % 3) for i in range(1100)) / sum(2 + i % 3 for i in range(1100))
    assert val.finish(_single)["vec"] == pytest.approx([expected] * 3)


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
    expected = single.finish(_single)
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
        assert metrics.finish(_single) == {"v": pytest.approx(expected)}, reducer


def test_validation_integer_extremes_stay_integers() -> None:
    metrics = ValidationMetrics(Reducer.MAX)
    metrics.add({"t": torch.tensor(3), "p": 7}, 4)
    metrics.add({"t": torch.tensor(9), "p": 2}, 4)
    result = metrics.finish(_single)
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
        metrics.finish(_single)


def test_zero_record_batch_does_not_move_the_average() -> None:
    metrics = ValidationMetrics(Reducer.AVG)
    metrics.add({"x": torch.tensor(2.0)}, 10)
    metrics.add({"x": torch.tensor(100.0)}, 0)
    assert metrics.finish(_single) == {"x": 2.0}
