"""A DeepSpeedTrial checkpoint resumed on another number of ranks (gloo on 127.0.0.1, ``torch_adam``): ZeRO-2
and ZeRO-3 checkpoints written by 2 ranks resume on 1, and ones written by 1 rank on 2, through DeepSpeed's
universal checkpoint. Three launches of tests/support/worker_deepspeed.py (2 ranks, 1, 2); every run keeps
the global batch of 16 records (2 ranks x 4 x 2 accumulation steps, or 1 rank x 8 x 2) and a WarmupLR.

What the resumed engine holds right after the load (every parameter's gathered fp32 weights and Adam moments)
must equal what the writer held at its checkpoint exactly, tensor by tensor, as must the LR scheduler's
state; the resumed run then ends where an uninterrupted 2-rank run does, within the float32 tolerance of
another reduction order (``atol=1e-6, rtol=1e-5``): the data position was kept. A changed global batch size
and an impossible split of it are clear errors before training.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.helpers_deepspeed_plan import run_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500), pytest.mark.usefixtures("cpu_device")]

ATOL, RTOL = 1e-6, 1e-5
LENGTH, STEPS = 10, 5
ON2 = {"gas": 2, "micro": 4, "scheduler": True, "record_loaded": True}  # 16 records on 2 ranks
ON1 = {**ON2, "micro": 8, "global_batch_size": 16}  # the same 16 on 1 rank


def _written_by(name: str, stage: int, on: dict[str, Any], dp: int) -> list[dict[str, Any]]:
    config = {**on, "stage": stage}
    return [{"name": f"{name}_full", "trial": "DSTrial", "config": config, "dp": dp},
            {"name": f"{name}_stop", "trial": "DSTrial", "config": config, "dp": dp, "stop_after": STEPS - 1,
             "state": True}]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("dsreshard")
    by_name: dict[str, list[dict[str, Any]]] = {}

    def launch(scenarios: list[dict[str, Any]], ranks: int) -> None:
        returncode, output, results = run_plan(tmp, scenarios, timeout=480, ranks=ranks)
        assert returncode == 0, output[-8000:]
        by_name.update(results)

    def resume(name: str, source: str, stage: int, on: dict[str, Any], dp: int) -> dict[str, Any]:
        return {"name": name, "trial": "DSTrial", "config": {**on, "stage": stage}, "dp": dp,
                "resume_uuid": by_name[source][0]["checkpoint"]}

    launch(_written_by("a2", 2, ON2, 2) + _written_by("a3", 3, ON2, 2), ranks=2)
    launch([resume("a2_on1", "a2_stop", 2, ON1, 1), resume("a3_on1", "a3_stop", 3, ON1, 1),
            *_written_by("b2", 2, ON1, 1)[1:], *_written_by("b3", 3, ON1, 1)[1:],
            {**resume("a2_batch8", "a2_stop", 2, {**ON1, "micro": 4, "global_batch_size": 8}, 1),
             "expect_error": True}], ranks=1)
    launch([resume("b2_on2", "b2_stop", 2, ON2, 2), resume("b3_on2", "b3_stop", 3, ON2, 2),
            {**resume("b2_split", "b2_stop", 2, {**ON2, "micro": 3, "global_batch_size": 16}, 2),
             "expect_error": True}], ranks=2)
    return by_name


def _close(got: list[list[float]], want: list[list[float]]) -> None:
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(("written", "resumed", "ranks"), [("a2_stop", "a2_on1", 1), ("a3_stop", "a3_on1", 1),
                                                           ("b2_stop", "b2_on2", 2), ("b3_stop", "b3_on2", 2)])
def test_another_number_of_ranks_loads_the_weights_optimizer_and_scheduler_exactly(
        results: Any, written: str, resumed: str, ranks: int) -> None:
    first, second = results[written], results[resumed]
    assert [(r["exit_reason"], r["checkpoint_steps"]) for r in first] == [("stopped", STEPS)] * len(first)
    assert len(second) == ranks
    saved = first[0]["final_state"]
    assert saved is not None and set(saved) == {"fp32", "exp_avg", "exp_avg_sq"}
    for rank in second:
        loaded = rank["loaded_state"]
        for key in saved:  # fp32 weights, Adam's two moments: parameter by parameter, exactly
            assert len(loaded[key]) == len(saved[key]) == 4
            for index, (got, want) in enumerate(zip(loaded[key], saved[key])):
                assert got == want, f"{key} of parameter {index} differs after the resume"
        assert rank["loaded_scheduler"] == first[0]["scheduler"] == {"last_batch_iteration": STEPS - 1}


@pytest.mark.parametrize(("resumed", "full"), [("a2_on1", "a2_full"), ("a3_on1", "a3_full"),
                                               ("b2_on2", "a2_full"), ("b3_on2", "a3_full")])
def test_the_resumed_run_ends_where_an_uninterrupted_one_does(results: Any, resumed: str, full: str) -> None:
    ranks, reference = results[resumed], results[full][0]
    assert [(r["exit_reason"], r["global_steps"]) for r in ranks] == [("completed", LENGTH)] * len(ranks)
    assert all(r["weights"] == ranks[0]["weights"] for r in ranks)
    assert all(r["scheduler"] == reference["scheduler"] == {"last_batch_iteration": LENGTH - 1} for r in ranks)
    _close(ranks[0]["weights"], reference["weights"])  # the data position was kept: the same batches


def test_a_changed_global_batch_size_is_a_clear_error(results: Any) -> None:
    (error,) = [r["error"] for r in results["a2_batch8"]]
    assert "global batch of 16 records" in error and "train_batch_size 8" in error
    assert "keep train_batch_size 16" in error


def test_an_impossible_split_of_the_global_batch_is_a_clear_error(results: Any) -> None:
    errors = [r["error"] for r in results["b2_split"]]
    assert len(errors) == 2 and all("train_batch_size" in e and "16" in e for e in errors), errors
