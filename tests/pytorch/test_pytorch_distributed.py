"""Distributed PyTorchTrial with real processes: 2 ranks on 127.0.0.1 over gloo against 1 rank with the
same global batch size (8). One 2-rank launch runs four scenarios in a row (full run, gradient
aggregation, a stop, a resume from a 1-rank checkpoint); the 1-rank runs happen in this process. A
second launch has a rank hang, which the other must report by rank within a bounded time.

Tolerance for "same model": ``atol=1e-6, rtol=1e-5``. Two ranks average two 4-record mean gradients
(DDP all-reduce), one rank takes the 8-record mean: the same sums in a different float32 order, so
the results differ in the last bits, and 12 momentum-SGD steps carry that along. Sample orders,
record counts and integer metrics are compared exactly.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from support import helpers_two_ranks as two_ranks
from support.helpers_paths import SUPPORT
from support.helpers_two_ranks import Results
from trials_pytorch_dist import LENGTH, VALIDATION_RECORDS, config
from worker_pytorch_dist import run

from determined_trials import TrialContext, core
from determined_trials.config import load_config
from determined_trials.errors import ConfigError

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)

RUN_S = 120  # both ranks' whole plan, to their exit
WORKER = SUPPORT / "worker_pytorch_dist.py"
ATOL, RTOL = 1e-6, 1e-5
STOP_2 = 6  # the 2-rank run stops after batch_idx 6 (7 trained: mid-epoch 1, between reports at 6 and 9)
STOP_1 = 3  # the 1-rank run stops after batch_idx 3 (4 trained: mid-epoch 0, between reports at 3 and 6)
HANG_TIMEOUT_S = 5
HANG_BOUND_S = 2 * HANG_TIMEOUT_S + 10  # gloo's timeout, then at most one more asking the ranks, then exit


def _only_checkpoint(run_dir: Path, trial_id: int) -> str:
    """The uuid of the stop checkpoint (the last one) of a trial."""
    return core.LocalStore(run_dir).checkpoints(trial_id=trial_id)[-1].uuid


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Results, dict[str, Path]]:
    """1-rank runs here, then one 2-rank launch, then the 1-rank resume of the 2-rank checkpoint."""
    tmp = tmp_path_factory.mktemp("dist")
    dirs = {name: tmp / name for name in ("one", "one_agg", "one_to_two", "two", "two_agg", "two_to_one")}
    results: Results = {}
    with pytest.MonkeyPatch.context() as mp:
        for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "DET_JOB_ID"):
            mp.delenv(var, raising=False)
        results["one"] = [run({"run_dir": str(dirs["one"])}, 0)]
        results["one_agg"] = [run({"run_dir": str(dirs["one_agg"]), "aggregation": 2}, 0)]
        results["stop_one"] = [run({"run_dir": str(dirs["one_to_two"]), "stop_after": STOP_1}, 0)]
        one_ckpt = _only_checkpoint(dirs["one_to_two"], results["stop_one"][0]["trial_id"])
        results.update(two_ranks.launch(WORKER, tmp, [
            {"name": "two", "run_dir": str(dirs["two"])},
            {"name": "two_agg", "run_dir": str(dirs["two_agg"]), "aggregation": 2},
            {"name": "stop_two", "run_dir": str(dirs["two_to_one"]), "stop_after": STOP_2},
            {"name": "resume_two", "run_dir": str(dirs["one_to_two"]), "latest_checkpoint": one_ckpt},
        ], RUN_S))
        two_ckpt = _only_checkpoint(dirs["two_to_one"], results["stop_two"][0]["trial_id"])
        results["resume_one"] = [run({"run_dir": str(dirs["two_to_one"]), "latest_checkpoint": two_ckpt}, 0)]
    return results, dirs


# -- comparisons -----------------------------------------------------------------------------------


def _assert_close(actual: Any, expected: Any, what: str) -> None:
    torch.testing.assert_close(torch.tensor(actual, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64),
                               atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}: {m}")


def _assert_same_model(actual: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    assert actual.keys() == expected.keys(), what
    for name in expected:
        _assert_close(actual[name], expected[name], f"{what}.{name}")


def _global_batches(ranks: list[dict[str, Any]]) -> list[tuple[int, list[int]]]:
    """Per step: (batch_idx, rank 0's records + rank 1's ...), checking all ranks were at the same step."""
    steps = []
    for per_rank in zip(*(r["seen"] for r in ranks), strict=True):
        assert len({idx for idx, _ in per_rank}) == 1, f"ranks at different batch_idx: {per_rank}"
        steps.append((per_rank[0][0], [i for _, records in per_rank for i in records]))
    return steps


def _as_tuples(seen: list[Any]) -> list[tuple[int, list[int]]]:
    return [(idx, list(records)) for idx, records in seen]


# -- 1. the model ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_ranks_train_the_same_model_as_one(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    one, two = results["one"][0], results["two"]
    assert [r["model_type"] for r in two] == ["DDPModel", "DDPModel"] and one["model_type"] == "Sequential"
    assert [r["per_slot_batch_size"] for r in two] == [4, 4] and one["per_slot_batch_size"] == 8
    assert two[0]["weights"] == two[1]["weights"]  # DDP keeps the replicas bitwise identical
    _assert_same_model(two[0]["weights"], one["weights"], "2-rank model vs 1-rank model")
    # step by step: the all-reduced gradient on each rank is the 1-rank gradient of the global batch
    assert len(two[0]["grads"]) == len(one["grads"]) == LENGTH
    for step, expected in enumerate(one["grads"]):
        for rank in (0, 1):
            _assert_close(two[rank]["grads"][step], expected, f"rank {rank} gradient at batch {step}")
    # the tolerance is far below what a real difference would give: the model did move a lot
    first, last = torch.tensor(one["grads"][0]), torch.tensor(one["grads"][-1])
    assert (first - last).abs().max() > 100 * ATOL


# -- 2. metrics ------------------------------------------------------------------------------------


def _store_metrics(run_dir: Path, trial_id: int, group: str) -> list[tuple[int, dict[str, Any]]]:
    return [(m.steps_completed, m.metrics) for m in core.LocalStore(run_dir).metrics(trial_id, group=group)]


@pytest.mark.slow
def test_reported_metrics_equal_the_one_rank_values(runs: tuple[Results, dict[str, Path]]) -> None:
    results, dirs = runs
    one_id, two_id = results["one"][0]["trial_id"], results["two"][0]["trial_id"]
    for group, steps in (("validation", [6, 12]), ("training", [3, 6, 9, 12])):
        one = _store_metrics(dirs["one"], one_id, group)
        two = _store_metrics(dirs["two"], two_id, group)
        assert [s for s, _ in two] == [s for s, _ in one] == steps, group
        for (step, expected), (_, actual) in zip(one, two):
            assert actual.keys() == expected.keys(), (group, step)
            for key, value in expected.items():
                if isinstance(value, int):  # records, index_max/min, batches, epochs: exact
                    assert actual[key] == value, (group, step, key)
                else:
                    _assert_close(actual[key], value, f"{group} {key} at batch {step}")
    for step, metrics in _store_metrics(dirs["two"], two_id, "validation"):
        # SUM and MAX/MIN need both ranks' parts: rank 1 holds records 8 and 9 only
        assert metrics["records"] == VALIDATION_RECORDS and metrics["index_max"] == 9 and metrics["index_min"] == 0
        # AVG is weighted by records (8 on rank 0, 2 on rank 1): the mean of the 10 squared errors
        _assert_close(metrics["validation_loss"], metrics["sq_err_sum"] / VALIDATION_RECORDS, f"AVG at {step}")
        assert metrics["err_min"] < 0 < metrics["err_max"]


@pytest.mark.slow
def test_validation_visits_every_record_once_across_ranks(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    two = results["two"]
    passes = 2  # validations at batches 6 and 12
    assert two[0]["validated"] == list(range(8)) * passes  # batches [0..3], [4..7]
    assert two[1]["validated"] == [8, 9] * passes  # batch [8, 9]: an uneven split, no padding
    assert results["one"][0]["validated"] == list(range(VALIDATION_RECORDS)) * passes


# -- 3. data sharding ------------------------------------------------------------------------------


@pytest.mark.slow
def test_rank_batches_are_disjoint_and_make_up_the_global_batch(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    one, two = results["one"][0], results["two"]
    for (idx0, part0), (idx1, part1) in zip(two[0]["seen"], two[1]["seen"], strict=True):
        assert idx0 == idx1 and len(part0) == len(part1) == 4
        assert not set(part0) & set(part1), f"batch {idx0}: ranks share records"
    # rank r holds the r-th contiguous slice of the global batch one process sees at that step
    assert _global_batches(two) == _as_tuples(one["seen"])
    epoch0 = [i for _, records in one["seen"][:5] for i in records]
    assert sorted(epoch0) == list(range(40)) and epoch0 != list(range(40))  # a shuffled epoch


# -- 4. resume on another number of ranks ----------------------------------------------------------


@pytest.mark.slow
def test_a_two_rank_checkpoint_resumes_on_one_rank(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    one, stop, resume = results["one"][0], results["stop_two"], results["resume_one"][0]
    # only rank 0 asked to stop; both ranks stopped after the same batch and the chief checkpointed it
    assert [r["exit_reason"] for r in stop] == ["stopped", "stopped"]
    assert [len(r["seen"]) for r in stop] == [STOP_2 + 1, STOP_2 + 1]
    assert [w for w in stop[0]["store_writes"] if w[0] == "checkpoint"] == [["checkpoint", 6], ["checkpoint", 7]]
    assert stop[1]["store_writes"] == []
    assert resume["exit_reason"] == "completed" and resume["seen"][0][0] == STOP_2 + 1
    assert _global_batches(stop) + _as_tuples(resume["seen"]) == _as_tuples(one["seen"])
    _assert_same_model(resume["weights"], one["weights"], "2 ranks -> 1 rank")


@pytest.mark.slow
def test_a_one_rank_checkpoint_resumes_on_two_ranks(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    one, stop, resume = results["one"][0], results["stop_one"][0], results["resume_two"]
    assert stop["exit_reason"] == "stopped" and len(stop["seen"]) == STOP_1 + 1
    assert [r["exit_reason"] for r in resume] == ["completed", "completed"]
    for rank in (0, 1):
        assert resume[rank]["events"][0][:2] == ["startup", STOP_1 + 1]
        assert resume[rank]["events"][1][0] == "checkpoint_load_start"  # every rank loads the checkpoint
    assert _as_tuples(stop["seen"]) + _global_batches(resume) == _as_tuples(one["seen"])
    assert resume[0]["weights"] == resume[1]["weights"]
    _assert_same_model(resume[0]["weights"], one["weights"], "1 rank -> 2 ranks")


# -- 5. gradient aggregation -----------------------------------------------------------------------


@pytest.mark.slow
def test_gradient_aggregation_on_two_ranks(runs: tuple[Results, dict[str, Path]]) -> None:
    """aggregation_frequency 2: odd batches step. Before the step, gradients stay local (no all-reduce),
    so the two ranks differ and their mean is the 1-rank gradient; on the stepping batch DDP
    all-reduces the accumulated gradients, and the ranks agree again."""
    results, _ = runs
    one, two = results["one_agg"][0], results["two_agg"]
    _assert_same_model(two[0]["weights"], one["weights"], "aggregated 2-rank model vs 1-rank model")
    assert two[0]["weights"] == two[1]["weights"]
    for step, expected in enumerate(one["grads"]):
        g0, g1 = torch.tensor(two[0]["grads"][step]), torch.tensor(two[1]["grads"][step])
        if step % 2 == 0:  # accumulating only: no all-reduce
            assert (g0 - g1).abs().max() > 1e-3, f"batch {step}: the ranks' local gradients were synchronised"
            _assert_close(((g0 + g1) / 2).tolist(), expected, f"mean local gradient at batch {step}")
        else:
            assert torch.equal(g0, g1), f"batch {step}: the stepping batch did not all-reduce"
            _assert_close(g0.tolist(), expected, f"accumulated gradient at batch {step}")


# -- 6. who writes, who calls back -----------------------------------------------------------------


@pytest.mark.slow
def test_only_the_chief_reports_and_checkpoints(runs: tuple[Results, dict[str, Path]]) -> None:
    results, dirs = runs
    two = results["two"]
    assert two[1]["store_writes"] == []
    writes = sorted(tuple(w) for w in two[0]["store_writes"])
    assert writes == sorted([("metrics:training", s) for s in (3, 6, 9, 12)] + [("metrics:validation", 6),
                            ("metrics:validation", 12), ("checkpoint", 6), ("checkpoint", 12)])
    store = core.LocalStore(dirs["two"])
    checkpoints = store.checkpoints(trial_id=two[0]["trial_id"])
    assert [c.steps_completed for c in checkpoints] == [6, 12]
    assert sorted(p.name for p in (dirs["two"] / "checkpoints").iterdir()) == sorted(c.uuid for c in checkpoints)


@pytest.mark.slow
def test_callbacks_run_on_every_rank(runs: tuple[Results, dict[str, Path]]) -> None:
    """Every hook on both ranks with the same arguments (the reduced metrics, the broadcast uuid),
    except the chief-only save hooks."""
    results, _ = runs
    chief, worker = results["two"][0]["events"], results["two"][1]["events"]
    chief_only = ("checkpoint_save_start", "checkpoint_write_end")
    assert [e[0] for e in chief].count("checkpoint_save_start") == 2
    assert worker == [e for e in chief if e[0] not in chief_only]
    names = [e[0] for e in worker]
    assert names.count("workload_end") == 4 and names.count("validation_end") == 2
    assert names.count("checkpoint_upload_end") == 2 and names.count("epoch_end") == 2
    assert names[0] == "startup" and names[-1] == "shutdown"


# -- 7. batch sizes that do not split ---------------------------------------------------------------


class _TwoRanks:
    """Stands in for a DistributedContext of size 2 (only the layout is read)."""

    def get_size(self) -> int:
        return 2

    def get_rank(self) -> int:
        return 0


@pytest.mark.parametrize("global_batch_size, expected", [
    (1, r"global_batch_size \(1\) is smaller than .*\(2\).*some slots would get no records"),
    (9, r"global_batch_size \(9\) is not divisible by .*\(2\).*each slot would get 4 records and the effective "
        r"global batch size would be 8.*8 or 10"),
])
def test_a_global_batch_that_does_not_split_across_ranks(global_batch_size: int, expected: str) -> None:
    context = TrialContext(config=load_config(config()), hparams={"global_batch_size": global_batch_size},
                           trial_seed=0, distributed=_TwoRanks())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=expected):
        context.get_per_slot_batch_size()
    assert TrialContext(config=load_config(config()), hparams={"global_batch_size": 10}, trial_seed=0,
                        distributed=_TwoRanks()).get_per_slot_batch_size() == 5  # type: ignore[arg-type]


# -- 8. a hung rank ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_hung_rank_is_named_after_a_bounded_time(tmp_path: Path) -> None:
    """Rank 1 sleeps inside train_batch at batch 3. Rank 0 waits in DDP's gradient all-reduce, gloo
    gives up after DET_COLLECTIVE_TIMEOUT (its message names no rank), then the trainer asks every
    rank over the DistributedContext (another timeout at most) and raises a CollectiveError that
    names rank 1."""
    flag = tmp_path / "hung"
    scenario = {"name": "hang", "run_dir": str(tmp_path / "run"), "hang_at": 3, "hang_rank": 1, "flag": str(flag)}
    with two_ranks.ranks(WORKER, tmp_path, [scenario], DET_COLLECTIVE_TIMEOUT=str(HANG_TIMEOUT_S)) as procs:
        deadline = time.monotonic() + 90
        while not flag.exists():
            assert procs[0].poll() is None and procs[1].poll() is None, \
                two_ranks.log(tmp_path, 0) + two_ranks.log(tmp_path, 1)
            assert time.monotonic() < deadline, "rank 1 never reached batch 3"
            time.sleep(0.05)
        hung_at = time.monotonic()
        try:
            procs[0].wait(timeout=HANG_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank 0 still waits {HANG_BOUND_S} s after rank 1 hung:\n{two_ranks.log(tmp_path, 0)}")
        waited = time.monotonic() - hung_at
        assert procs[1].poll() is None  # still asleep: killed on the way out
    output = two_ranks.log(tmp_path, 0)
    assert procs[0].returncode not in (0, None), output
    assert HANG_TIMEOUT_S <= waited <= HANG_BOUND_S, waited  # measured: ~10.8 s
    assert "Timed out" in output  # gloo's own error, kept as the cause
    assert "CollectiveError" in output and "rank 1 did not answer within 5 s" in output, output[-3000:]
