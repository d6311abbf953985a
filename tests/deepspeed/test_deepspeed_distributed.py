"""DeepSpeedTrial with 2 real ranks (gloo on 127.0.0.1, ``torch_adam``, no JIT builds), one launch of
tests/support/worker_deepspeed.py through the torch_distributed launcher running every scenario in a row:
ZeRO 0 / 1 / 2 and gradient accumulation against a plain PyTorch loop, exact mid-epoch resume after a
stop request (ZeRO 0) and after SIGTERM (ZeRO 2), and a 2-stage pipeline.

Tolerance for "same weights as the plain loop": ``atol=1e-6, rtol=1e-5`` (two ranks average two partial
mean gradients, or GAS micro-batch means, where the plain loop takes one mean: the same sums in another
float32 order, carried through 10 Adam steps). Resumed runs must equal uninterrupted ones bitwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.helpers_deepspeed_plan import run_plan
from trials_deepspeed import VALIDATION_RECORDS, plain_loop

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device")]

ATOL, RTOL = 1e-6, 1e-5
LENGTH = 10

SCENARIOS: list[dict[str, Any]] = [
    {"name": "z0", "trial": "DSTrial", "config": {"stage": 0}},
    {"name": "z0_stop", "trial": "DSTrial", "config": {"stage": 0}, "stop_after": 5},
    {"name": "z0_resume", "trial": "DSTrial", "config": {"stage": 0}, "resume": "z0_stop"},
    {"name": "z2", "trial": "DSTrial", "config": {"stage": 2, "gas": 2}},
    {"name": "z2_sigterm", "trial": "Signalling", "config": {"stage": 2, "gas": 2}, "sigterm_after": 4,
     "signal_rank": 0},
    {"name": "z2_resume", "trial": "DSTrial", "config": {"stage": 2, "gas": 2}, "resume": "z2_sigterm"},
    {"name": "z1", "trial": "DSTrial", "config": {"stage": 1, "gas": 2}},
    {"name": "pipe", "trial": "PipeTrial", "config": {"stage": 0, "gas": 2}, "dp": 1},
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    returncode, output, by_name = run_plan(tmp_path_factory.mktemp("ds2"), SCENARIOS, timeout=280)
    # 75: the launcher saw the preemption of scenario z2_sigterm (the later scenarios ran on)
    assert returncode == 75, output[-12000:]
    return by_name


def _close(weights: list[list[float]], reference: list[list[float]]) -> None:
    assert len(weights) == len(reference)
    for got, want in zip(weights, reference):
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(("name", "global_batch"), [("z0", 8), ("z1", 16), ("z2", 16)])
def test_zero_stages_and_accumulation_match_a_plain_loop(results: Any, name: str, global_batch: int) -> None:
    ranks = results[name]
    assert ranks[0]["weights"] == ranks[1]["weights"]  # data parallel: the same model everywhere
    _close(ranks[0]["weights"], plain_loop(LENGTH, global_batch))
    gas = global_batch // 8
    assert [r["calls"] for r in ranks] == [LENGTH * gas] * 2  # train_batch once per micro-batch
    assert [r["global_steps"] for r in ranks] == [LENGTH] * 2  # one optimizer step per batch


@pytest.mark.parametrize(("stopped", "resumed", "full", "steps"),
                         [("z0_stop", "z0_resume", "z0", 6), ("z2_sigterm", "z2_resume", "z2", 5)])
def test_resume_mid_epoch_is_exact(results: Any, stopped: str, resumed: str, full: str, steps: int) -> None:
    first = results[stopped]
    assert [r["exit_reason"] for r in first] == (["stopped"] * 2 if "stop" in stopped else ["preempted"] * 2)
    assert [r["checkpoint_steps"] for r in first] == [steps, steps]  # mid-epoch (8 or 4 batches per epoch)
    second = results[resumed]
    assert [r["exit_reason"] for r in second] == ["completed"] * 2
    assert second[0]["weights"] == results[full][0]["weights"]  # bitwise
    starts = [e for e in second[0]["events"] if e[0] == "startup"]
    assert starts == [["startup", steps, first[0]["checkpoint"]]]
    assert ["checkpoint_load_start", ["callbacks", "rng_state"]] in second[1]["events"]


def test_hooks_run_in_the_pytorch_order_on_every_rank(results: Any) -> None:
    names = [e[0] for e in results["z0"][0]["events"]]  # boundaries 3, 5 (validate, save), 6, 9, 10 (same)
    save = ["checkpoint_save_start", "checkpoint_write_end", "checkpoint_upload_end"]
    boundary = ["workload_end"]
    expected = (["startup", "training_start", "epoch_start"] + boundary * 2 + ["validation_start", "validation_end"]
                + save + boundary + ["epoch_end", "epoch_start"] + boundary * 2 + ["validation_start", "validation_end"]
                + save + ["shutdown"])
    assert names == expected
    assert [e[0] for e in results["z0"][1]["events"]] == expected  # every rank saves its shard
    workloads = [e[1] for e in results["z0"][0]["events"] if e[0] == "workload_end"]
    assert [w["records_seen"] for w in workloads] == [3 * 8, 2 * 8, 1 * 8, 3 * 8, 1 * 8]  # reducer, both ranks
    validation = next(e[1] for e in results["z0"][1]["events"] if e[0] == "validation_end")
    assert set(validation) == {"val_loss", "records_seen"}


def test_a_two_stage_pipeline_trains_and_validates(results: Any) -> None:
    ranks = results["pipe"]
    assert [r["stage"] for r in ranks] == [0, 1]
    assert [r["mpu"] for r in ranks] == [[0, 1, False, True], [0, 1, True, True]]  # metrics from the loss stage
    assert [r["calls"] for r in ranks] == [LENGTH, LENGTH]  # the engine pulls its 2 micro-batches itself
    _close(ranks[0]["weights"] + ranks[1]["weights"], plain_loop(LENGTH, 8))
    validations = [e[1] for e in ranks[0]["events"] if e[0] == "validation_end"]
    assert len(validations) == 2 and all(v["val_loss"] > 0 for v in validations)
    assert validations == [e[1] for e in ranks[1]["events"] if e[0] == "validation_end"]
    assert VALIDATION_RECORDS // 8 * 8 == 16  # 2 pipeline calls of 2 micro-batches of 4 records
