"""DeepSpeedTrial with ZeRO stage 3 on 2 real ranks (gloo on 127.0.0.1, ``torch_adam``, no JIT builds), one
launch of tests/support/worker_deepspeed.py: the model built partitioned in ``context.zero_init``, trained
against the plain PyTorch loop, validated on data that splits unevenly over the ranks (20 records in batches
of 8: rank 0 gets 2 batches, rank 1 one; 8 records: rank 1 gets none), stopped and resumed bitwise, its
checkpoint consolidated into one plain ``state_dict``; and pretrained weights loaded into the partitioned
model (the recipe of docs/deepspeed.md).

Tolerances as in test_deepspeed_distributed.py (``atol=1e-6, rtol=1e-5`` against the plain loop: the same
sums in another float32 order); resumed runs and the export must equal bitwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.helpers_deepspeed_plan import run_plan
from trials_deepspeed import VALIDATION_RECORDS, data, make_model, plain_loop

from determined_trials import deepspeed as det_ds
from determined_trials.cli.main import main as cli_main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device")]

LENGTH = 10
Z3 = {"stage": 3, "gas": 2}
SCENARIOS: list[dict[str, Any]] = [
    {"name": "z3", "trial": "DSTrial", "config": Z3},
    {"name": "z3_stop", "trial": "DSTrial", "config": Z3, "stop_after": 2},
    {"name": "z3_resume", "trial": "DSTrial", "config": Z3, "resume": "z3_stop"},
    {"name": "z3_stop5", "trial": "DSTrial", "config": Z3, "stop_after": 4},
    {"name": "z3_resume5", "trial": "DSTrial", "config": Z3, "resume": "z3_stop5"},
    {"name": "z3pretrained", "trial": "PretrainedTrial", "config": Z3},
    {"name": "z3small", "trial": "DSTrial", "config": {**Z3, "val_records": 8}},
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[dict[str, Any]]]]:
    tmp = tmp_path_factory.mktemp("ds3")
    returncode, output, by_name = run_plan(tmp, SCENARIOS, timeout=240)
    assert returncode == 0, output[-8000:]
    return tmp, by_name


def _one_rank_val_loss(weights: list[list[float]], records: int) -> float:
    """The validation loss of these weights evaluated by one process over the whole set (batches of 8)."""
    model = make_model()
    with torch.no_grad():
        for param, values in zip(model.parameters(), weights):
            param.copy_(torch.tensor(values).reshape(param.shape))
        x, y = data(records, 2).tensors
        losses = [(torch.nn.functional.mse_loss(model(x[i:i + 8]), y[i:i + 8]).item(), len(x[i:i + 8]))
                  for i in range(0, records, 8)]
    return sum(loss * n for loss, n in losses) / records


def test_a_zero3_model_built_partitioned_trains_like_the_plain_loop(results: Any) -> None:
    ranks = results[1]["z3"]
    assert [(r["zero_stage"], r["built_numel"]) for r in ranks] == [(3, 0)] * 2  # no rank held the whole model
    assert ranks[0]["weights"] == ranks[1]["weights"]  # the gathered parameters
    for got, want in zip(ranks[0]["weights"], plain_loop(LENGTH, 16)):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5)
    assert [r["global_steps"] for r in ranks] == [LENGTH] * 2 and [r["calls"] for r in ranks] == [2 * LENGTH] * 2


def test_pretrained_weights_load_into_the_partitioned_model(results: Any) -> None:
    ranks = results[1]["z3pretrained"]  # built from other weights, then given the plain loop's initial ones
    assert ranks[0]["weights"] == ranks[1]["weights"] == results[1]["z3"][0]["weights"]


@pytest.mark.parametrize(("name", "records", "calls"), [("z3", VALIDATION_RECORDS, 2), ("z3small", 8, 1)])
def test_uneven_validation_runs_in_step_and_equals_a_one_rank_evaluation(
        results: Any, name: str, records: int, calls: int) -> None:
    ranks = results[1][name]
    validations = [[e[1]["val_loss"] for e in r["events"] if e[0] == "validation_end"] for r in ranks]
    assert len(validations[0]) == 2 and validations[0] == validations[1]
    assert [r["eval_calls"] for r in ranks] == [2 * calls] * 2  # rank 1 padded: the same forward passes
    # the last validation ran on the final weights: padding is not counted
    assert validations[0][-1] == pytest.approx(_one_rank_val_loss(ranks[0]["weights"], records), rel=1e-6)


@pytest.mark.parametrize(("stopped", "resumed", "steps"), [("z3_stop", "z3_resume", 3), ("z3_stop5", "z3_resume5", 5)])
def test_a_stop_resumes_bitwise(results: Any, stopped: str, resumed: str, steps: int) -> None:
    first, second = results[1][stopped], results[1][resumed]
    assert [r["exit_reason"] for r in first] == ["stopped"] * 2
    # mid-epoch (4 batches of 16 per epoch), and at a batch where the periods validate and checkpoint too
    assert [r["checkpoint_steps"] for r in first] == [steps, steps]
    assert [r["exit_reason"] for r in second] == ["completed"] * 2
    assert second[0]["weights"] == second[1]["weights"] == results[1]["z3"][0]["weights"]


def test_the_checkpoint_consolidates_into_the_gathered_parameters(results: Any, tmp_path: Path) -> None:
    tmp, by_name = results
    run_dir = tmp / "run" / "z3"
    uuid = by_name["z3"][0]["checkpoint"]
    assert by_name["z3"][0]["checkpoint_steps"] == LENGTH
    folder = run_dir / "checkpoints" / uuid
    assert {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)} <= {p.name for p in
                                                                                 (folder / "model0").iterdir()}
    state = det_ds.consolidate_checkpoint(folder)
    model = make_model()
    model.load_state_dict(state)  # strict: every key, every shape
    assert [p.detach().reshape(-1).tolist() for p in model.parameters()] == by_name["z3"][0]["weights"]
    assert cli_main(["--run-dir", str(run_dir), "checkpoint", "export", uuid, str(tmp_path / "out"),
                     "--consolidate"]) == 0
    exported = torch.load(tmp_path / "out" / "model0_consolidated.pt", weights_only=True)
    assert exported.keys() == state.keys() and all(torch.equal(exported[k], state[k]) for k in state)
