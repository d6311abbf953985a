"""PyTorchTrial on a device mesh (``resources.mesh``, ``context.get_device_mesh()``) with real gloo processes:
FSDPTrial's MLP (tests/support/trials_mesh.py) under HSDP (dp_replicate 2 x dp_shard 1), tensor parallel
(tp 2) and dp_shard 2 x tp 2 on 4 ranks, against the same trial unsharded in one process on the same global
batches (8); a dp_shard 2 x tp 2 checkpoint resumed on (dp_shard 2), (tp 2) and one process; the mistakes.

One 4-rank launch, then one 2-rank launch; the 1-process runs happen in this process. "Same model" within
``atol=1e-6, rtol=1e-5`` as in test_fsdp.py (the ranks sum the same gradients in another float32 order);
what a resumed run loads is compared exactly with what was saved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support import helpers_two_ranks as ranks
from support.helpers_paths import SUPPORT
from support.helpers_two_ranks import Results
from worker_fsdp import run

from determined_trials import core
from determined_trials.cli.main import main as cli_main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device")]

RUN_S = 300  # one launch's whole plan, to its exit
WORKER = SUPPORT / "worker_fsdp.py"
ATOL, RTOL = 1e-6, 1e-5
STOP = 4  # stop after batch_idx 4: 5 batches trained (mid-epoch 0), the checkpoint the resumes start from
MESH_22 = {"slots": 4, "mesh": {"dp_shard": 2, "tp": 2}}
RESUMES = {"resume_21": {"slots": 2, "mesh": {"dp_shard": 2}}, "resume_12": {"slots": 2, "mesh": {"tp": 2}}}


def _checkpoint(run_dir: Path, trial_id: int) -> str:
    return core.LocalStore(run_dir).checkpoints(trial_id=trial_id)[-1].uuid


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Results, dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("mesh")
    for launch in ("four", "two"):
        (tmp / launch).mkdir()
    dirs = {name: tmp / name for name in ("one", "full_22", "stop_22", "hsdp", "tp")}
    results: Results = {}
    with pytest.MonkeyPatch.context() as mp:
        for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "DET_JOB_ID"):
            mp.delenv(var, raising=False)
            results["one"] = [run({"run_dir": str(dirs["one"]), "mesh": True}, 0)]
        results.update(ranks.launch(WORKER, tmp / "four", [
            {"name": "full_22", "run_dir": str(dirs["full_22"]), "mesh": True, "config": MESH_22},
            {"name": "stop_22", "run_dir": str(dirs["stop_22"]), "mesh": True, "config": MESH_22, "stop_after": STOP},
        ], RUN_S, world=4))
        stopped = _checkpoint(dirs["stop_22"], results["stop_22"][0]["trial_id"])
        results.update(ranks.launch(WORKER, tmp / "two", [
            {"name": "hsdp", "run_dir": str(dirs["hsdp"]), "mesh": True,
             "config": {"slots": 2, "mesh": {"dp_replicate": 2}}},
            {"name": "tp", "run_dir": str(dirs["tp"]), "mesh": True, "config": {"slots": 2, "mesh": {"tp": 2}}},
            *({"name": name, "run_dir": str(dirs["stop_22"]), "mesh": True, "config": conf,
               "latest_checkpoint": stopped} for name, conf in RESUMES.items()),
            {"name": "errors", "mesh_errors": True},
        ], RUN_S))
        results["resume_1"] = [run({"run_dir": str(dirs["stop_22"]), "mesh": True, "latest_checkpoint": stopped}, 0)]
    return results, {**dirs, "stopped": Path(stopped)}


def _close(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(torch.tensor(a[key]), torch.tensor(b[key]), atol=ATOL, rtol=RTOL, msg=key)


def _global_seen(result: list[dict[str, Any]], tp: int) -> dict[int, list[int]]:
    """Per batch_idx, the sorted records the data-parallel groups trained on (one ``tp`` rank each)."""
    seen: dict[int, list[int]] = {}
    for rank in result[::tp]:
        for batch_idx, records in rank["seen"]:
            seen.setdefault(batch_idx, []).extend(records)
    return {b: sorted(r) for b, r in seen.items()}


def _reports(run_dir: Path, trial_id: int, group: str) -> list[dict[str, Any]]:
    return [r.metrics for r in core.LocalStore(run_dir).metrics(trial_id, group=group)]


@pytest.mark.parametrize(("name", "tp"), [("hsdp", 1), ("tp", 2), ("full_22", 2)])
def test_a_mesh_trains_the_one_process_model_and_reports_each_record_once(
    runs: tuple[Results, dict[str, Path]], name: str, tp: int
) -> None:
    results, dirs = runs
    mesh, one = results[name], results["one"][0]
    assert all(r["state"] == mesh[0]["state"] for r in mesh)  # the gathered model is one model
    _close(mesh[0]["state"], one["state"])
    for group in range(0, len(mesh), tp):  # a tensor-parallel group's ranks read the same batches
        assert all(r["seen"] == mesh[group]["seen"] for r in mesh[group:group + tp])
    dp = len(mesh) // tp
    assert all(len(records) == 8 // dp for rank in mesh for _, records in rank["seen"])
    assert _global_seen(mesh, tp) == _global_seen([one], 1)
    assert [r["background"] for r in mesh] == [[4, 8]] * len(mesh)  # DCP in the background (12: at once)
    ours, theirs = (_reports(dirs[n], results[n][0]["trial_id"], "training") for n in (name, "one"))
    assert [r["records_trained"] for r in ours] == [r["records_trained"] for r in theirs]  # each record once
    for group in ("training", "validation"):
        ours, theirs = (_reports(dirs[n], results[n][0]["trial_id"], group) for n in (name, "one"))
        key = "loss" if group == "training" else "validation_loss"
        torch.testing.assert_close(torch.tensor([r[key] for r in ours]), torch.tensor([r[key] for r in theirs]),
                                   atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ["resume_21", "resume_12", "resume_1"])
def test_a_2x2_checkpoint_resumes_on_another_mesh_with_what_was_saved(
    runs: tuple[Results, dict[str, Path]], name: str
) -> None:
    results, _ = runs
    stop, resumed, one = results["stop_22"], results[name], results["one"][0]
    assert all(r["exit_reason"] == "stopped" for r in stop)
    assert all(r["loaded"] == stop[0]["state"] for r in resumed)  # weights, optimizer state, lr: exactly
    tp = 2 if name == "resume_12" else 1
    assert {**_global_seen(stop, 2), **_global_seen(resumed, tp)} == _global_seen([one], 1)  # data position
    assert min(_global_seen(resumed, tp)) == STOP + 1
    _close(resumed[0]["state"], one["state"])


def test_export_consolidates_a_2x2_checkpoint(runs: tuple[Results, dict[str, Path]], tmp_path: Path) -> None:
    results, dirs = runs
    export = tmp_path / "export"
    assert cli_main(["--run-dir", str(dirs["stop_22"]), "checkpoint", "export", "--consolidate",
                     str(dirs["stopped"]), str(export)]) == 0
    exported = torch.load(export / "model0_consolidated.pt", weights_only=True)
    saved = results["stop_22"][0]["state"]
    assert {f"model.{k}": v.tolist() for k, v in exported.items()} == {
        k: v for k, v in saved.items() if k.startswith("model.")}


def test_a_wrong_mesh_is_a_clear_error_before_training(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    for found in results["errors"]:
        assert found["mesh"] == {"names": ["dp_replicate", "dp_shard", "tp"], "shape": [1, 1, 2]}
        assert found["wrong_size"] == (
            "ConfigError: resources.mesh (dp_replicate 1 x dp_shard 2 x tp 2) has 4 ranks but this job has 2 "
            "processes. Fix: launch slots_per_trial = 4 processes, or change the mesh")
        assert found["tp_divides"] is not None and found["tp_divides"].startswith(
            "the tensor-parallel plan shards parameter '0.weight' (shape (5, 4)) along dimension 0 (5) over tp=2 "
            "ranks, which does not divide it")
