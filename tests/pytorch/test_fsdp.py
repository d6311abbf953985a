"""FSDP2 in PyTorchTrial with real processes: 2 gloo ranks on 127.0.0.1 (fully_shard per block and on the
root) against the same trial unsharded in one process, with the same global batches (8).

One 2-rank launch runs the scenarios in a row (full run, stop + "latest" resume, gradient aggregation with
a stop between two optimizer steps + resume, clipping, resume of a 1-process checkpoint, the errors); the
1-process runs happen in this process. Tolerance for "same model" (sharded against unsharded):
``atol=1e-6, rtol=1e-5``: FSDP2's reduce-scatter averages two 4-record mean gradients where one process
takes the 8-record mean, the same sums in another float32 order, carried through 12 AdamW steps. Resumes
on the same number of processes, and what a resharded resume loads, are compared exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support import helpers_two_ranks as two_ranks
from support.helpers_buckets import (  # noqa: F401 (the *_server fixtures)
    azure_server_fixture,
    bucket_server,
    bucket_spec,
    gcs_server_fixture,
    s3_server_fixture,
)
from support.helpers_paths import SUPPORT
from support.helpers_two_ranks import Results
from worker_fsdp import run

from determined_trials import core
from determined_trials.cli.main import main as cli_main
from determined_trials.core.storage import storage_from_spec

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device")]

RUN_S = 240  # both ranks' whole plan, to their exit
WORKER = SUPPORT / "worker_fsdp.py"
ATOL, RTOL = 1e-6, 1e-5
STOP = 4  # stop after batch_idx 4: 5 batches trained, mid-epoch 0 (6 a epoch), after the checkpoint at 4
CLIP = 0.5
BUCKETS = ("gcs", "azure")  # sharded checkpoints in a bucket: each rank uploads its own shard files


def _last_checkpoint(run_dir: Path, trial_id: int) -> str:
    return core.LocalStore(run_dir).checkpoints(trial_id=trial_id)[-1].uuid


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> tuple[Results, dict[str, Path]]:
    """1-process runs here, one 2-rank launch, then the 1-process resume of a 2-rank checkpoint."""
    tmp = tmp_path_factory.mktemp("fsdp")
    buckets = {kind: bucket_spec(kind, bucket_server(request, kind)) for kind in BUCKETS}
    in_buckets = [scenario for kind, spec in buckets.items() for scenario in (
        {"name": f"stop_{kind}", "run_dir": str(tmp / kind), "stop_after": STOP, "storage": spec},
        {"name": f"resume_{kind}", "run_dir": str(tmp / kind), "latest_checkpoint": "latest", "storage": spec})]
    names = ("one", "one_double", "one_clip", "one_to_two", "two", "stop", "agg", "stop_agg", "clip", "two_to_one", "fails", "mp",
             "stop_mp")
    dirs = {name: tmp / name for name in names}
    results: Results = {}
    with pytest.MonkeyPatch.context() as mp:
        for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "DET_JOB_ID"):
            mp.delenv(var, raising=False)
        results["one"] = [run({"run_dir": str(dirs["one"])}, 0)]
        results["one_double"] = [run({"run_dir": str(dirs["one_double"]), "length": 6,
                                      "config": {"global_batch": 16, "scheduler": False}}, 0)]
        results["one_clip"] = [run({"run_dir": str(dirs["one_clip"]), "config": {"clip": CLIP}}, 0)]
        results["stop_one"] = [run({"run_dir": str(dirs["one_to_two"]), "stop_after": STOP}, 0)]
        one_ckpt = _last_checkpoint(dirs["one_to_two"], results["stop_one"][0]["trial_id"])
        agg = {"aggregation": 2, "scheduler": False}
        results.update(two_ranks.launch(WORKER, tmp, [
            {"name": "two", "run_dir": str(dirs["two"])},
            {"name": "stop_two", "run_dir": str(dirs["stop"]), "stop_after": STOP},
            {"name": "resume_two", "run_dir": str(dirs["stop"]), "latest_checkpoint": "latest"},
            {"name": "agg", "run_dir": str(dirs["agg"]), "config": agg},
            {"name": "stop_agg", "run_dir": str(dirs["stop_agg"]), "config": agg, "stop_after": STOP},
            {"name": "resume_agg", "run_dir": str(dirs["stop_agg"]), "config": agg, "latest_checkpoint": "latest"},
            {"name": "clip", "run_dir": str(dirs["clip"]), "config": {"clip": CLIP}},
            {"name": "mp", "run_dir": str(dirs["mp"]), "config": {"mixed_precision": True}},
            {"name": "stop_mp", "run_dir": str(dirs["stop_mp"]), "config": {"mixed_precision": True},
             "stop_after": STOP},
            {"name": "resume_mp", "run_dir": str(dirs["stop_mp"]), "config": {"mixed_precision": True},
             "latest_checkpoint": "latest"},
            {"name": "resume_from_one", "run_dir": str(dirs["one_to_two"]), "latest_checkpoint": one_ckpt},
            {"name": "pbt_child", "run_dir": str(dirs["stop"]), "config": {"lr": 0.03}, "length": 14,
             "latest_checkpoint": "newest"},  # resume_two's last checkpoint with a new lr: a PBT child's start
            {"name": "stop_for_one", "run_dir": str(dirs["two_to_one"]), "stop_after": STOP},
            {"name": "errors", "errors": True},
            {"name": "prepare_fails", "run_dir": str(dirs["fails"]), "prepare_fails": True},
            *in_buckets,
        ], RUN_S))
        two_ckpt = _last_checkpoint(dirs["two_to_one"], results["stop_for_one"][0]["trial_id"])
        results["resume_one"] = [run({"run_dir": str(dirs["two_to_one"]), "latest_checkpoint": two_ckpt}, 0)]
    dirs.update({f"bucket_{kind}": tmp / kind for kind in BUCKETS})
    results.update({f"spec_{kind}": [spec] for kind, spec in buckets.items()})
    return results, dirs


def _close(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(torch.tensor(a[key]), torch.tensor(b[key]), atol=ATOL, rtol=RTOL, msg=key)


def _global_seen(result: list[dict[str, Any]]) -> dict[int, list[int]]:
    """Per batch_idx, the sorted records every rank trained on."""
    seen: dict[int, list[int]] = {}
    for rank in result:
        for batch_idx, records in rank["seen"]:
            seen.setdefault(batch_idx, []).extend(records)
    return {b: sorted(r) for b, r in seen.items()}


def test_sharded_training_equals_one_unsharded_process(runs: tuple[Results, dict[str, Path]]) -> None:
    results, dirs = runs
    two, one = results["two"], results["one"][0]
    assert [r["fsdp"] for r in two] == [True, True] and not one["fsdp"]
    assert two[0]["state"] == two[1]["state"]  # the gathered model is one model
    _close(two[0]["state"], one["state"])
    assert _global_seen(two) == _global_seen([one])
    assert all(len(records) == 4 for rank in two for _, records in rank["seen"])
    assert [r["background"] for r in two] == [[4, 8], [4, 8]]  # the last one (12) is written at once
    reports = core.LocalStore(dirs["two"]).metrics(two[0]["trial_id"], group="training")
    seen = _global_seen(two)
    assert [r.metrics["records_trained"] for r in reports] == [sorted(seen[b] + seen[b + 1]) for b in range(0, 12, 2)]


def test_a_checkpoint_holds_one_shard_a_rank_and_no_full_copy(runs: tuple[Results, dict[str, Path]]) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    _, dirs = runs
    folders = sorted(p for p in (dirs["two"] / "checkpoints").iterdir() if not p.name.startswith("."))
    assert len(folders) == 3  # batches 4, 8 and 12
    for folder in folders:
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        assert files == ["dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp", "load_data.json",
                         "metadata.json", "rank_state/rank0.pth", "rank_state/rank1.pth", "trial_state.json"]
        metadata = FileSystemReader(str(folder / "dcp")).read_metadata()
        weight = metadata.state_dict_metadata["model.0.2.weight"]  # 16 x 16: 8 rows a rank
        assert [list(c.sizes) for c in weight.chunks] == [[8, 16], [8, 16]]
        assert {info.relative_path for index, info in metadata.storage_data.items()
                if index.fqn == "model.0.2.weight"} == {"__0_0.distcp", "__1_0.distcp"}
        exp_avg = metadata.state_dict_metadata["optim.state.0.2.weight.exp_avg"]
        assert len(exp_avg.chunks) == 2
        assert not (folder / "state_dict.pth").exists()


def test_resume_on_two_is_bitwise(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    pairs = (("stop_two", "resume_two", "two"), ("stop_agg", "resume_agg", "agg"), ("stop_mp", "resume_mp", "mp"))
    for stop, resume, full in pairs:
        assert [r["exit_reason"] for r in results[stop]] == ["stopped", "stopped"] or results[stop][0]["exit_reason"]
        assert results[resume][0]["state"] == results[full][0]["state"], resume
        seen = {**_global_seen(results[stop]), **_global_seen(results[resume])}
        assert seen == _global_seen(results[full])
        assert min(b for b, _ in results[resume][0]["seen"]) == STOP + 1


@pytest.mark.parametrize("kind", BUCKETS)
def test_a_sharded_checkpoint_in_a_bucket_resumes_bitwise_and_exports(
    runs: tuple[Results, dict[str, Path]], kind: str, tmp_path: Path
) -> None:
    results, dirs = runs
    stop, resume, spec = results[f"stop_{kind}"], results[f"resume_{kind}"], results[f"spec_{kind}"][0]
    assert [r["background"] for r in stop] == [[4], [4]]  # batch 4's shards went up off the training thread
    assert resume[0]["state"] == resume[1]["state"] == results["two"][0]["state"]  # both ranks' shards came back
    assert {**_global_seen(stop), **_global_seen(resume)} == _global_seen(results["two"])
    store, storage = core.LocalStore(dirs[f"bucket_{kind}"]), storage_from_spec(spec, default_dir=tmp_path)
    kept = store.checkpoints(trial_id=resume[0]["trial_id"])
    assert [c.steps_completed for c in kept] == [4, 5, 8, 12]  # checkpoint_policy "none": no retention here
    assert storage.list_checkpoints() == sorted(c.uuid for c in kept)
    last = kept[-1]
    assert last.steps_completed == 12 and sorted(storage.list_files(last.uuid)) == [
        "dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp", "load_data.json", "metadata.json",
        "rank_state/rank0.pth", "rank_state/rank1.pth", "trial_state.json"]  # each rank uploaded its own
    assert not any((dirs[f"bucket_{kind}"] / "checkpoints").glob("*/metadata.json"))  # no local copy kept
    export = tmp_path / "export"
    assert cli_main(["--run-dir", str(dirs[f"bucket_{kind}"]), "checkpoint", "export", "--consolidate", last.uuid,
                     str(export)]) == 0
    exported = torch.load(export / "model0_consolidated.pt", weights_only=True)
    two = results["two"][0]["state"]
    assert {f"model.{k}": v.tolist() for k, v in exported.items()} == {k: v for k, v in two.items() if k.startswith("model.")}


def test_mixed_precision_keeps_float32_shards_and_trains_near_float32(runs: tuple[Results, dict[str, Path]]) -> None:
    results, dirs = runs
    mp, two = results["mp"][0]["state"], results["two"][0]["state"]
    assert mp != two  # bfloat16 compute changed the result...
    for key in mp:  # ...but not by much (12 steps of bfloat16 forward and backward)
        torch.testing.assert_close(torch.tensor(mp[key]), torch.tensor(two[key]), atol=0.05, rtol=0.05, msg=key)
    from torch.distributed.checkpoint import FileSystemReader

    folder = next(p for p in (dirs["mp"] / "checkpoints").iterdir() if not p.name.startswith("."))
    metadata = FileSystemReader(str(folder / "dcp")).read_metadata()
    assert metadata.state_dict_metadata["model.0.2.weight"].properties.dtype == torch.float32


def test_aggregation_of_two_equals_a_double_batch(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    _close(results["agg"][0]["state"], results["one_double"][0]["state"])
    assert [r["syncs"] for r in results["agg"]] == [[False, True] * 6] * 2  # reduce-scatter only when stepping
    assert [r["syncs"] for r in results["two"]] == [[True] * 12] * 2


def test_clipping_clips(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    clip, one_clip = results["clip"], results["one_clip"][0]
    assert clip[0]["norms"] == clip[1]["norms"] and len(clip[0]["norms"]) == 12
    assert max(clip[0]["norms"]) > CLIP  # the norms before clipping: clipping had work to do
    torch.testing.assert_close(torch.tensor(clip[0]["norms"]), torch.tensor(one_clip["norms"]), atol=1e-5, rtol=1e-5)
    _close(clip[0]["state"], one_clip["state"])
    assert clip[0]["state"]["model.0.weight"] != results["two"][0]["state"]["model.0.weight"]


def test_two_to_one_loads_what_was_saved_and_goes_on(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    resumed = results["resume_one"][0]
    assert resumed["loaded"] == results["stop_for_one"][0]["state"]  # exactly what the stop checkpoint held
    assert not resumed["fsdp"]
    seen = {**_global_seen(results["stop_for_one"]), **_global_seen([resumed])}
    assert seen == _global_seen(results["two"])  # no record repeated or skipped
    _close(resumed["state"], results["two"][0]["state"])


def test_one_to_two_loads_what_was_saved_and_goes_on(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    resumed = results["resume_from_one"]
    assert resumed[0]["loaded"] == resumed[1]["loaded"] == results["stop_one"][0]["state"]
    seen = {**_global_seen(results["stop_one"]), **_global_seen(resumed)}
    assert seen == _global_seen(results["one"])
    _close(resumed[0]["state"], results["one"][0]["state"])


def test_a_pbt_child_with_a_new_lr_keeps_the_schedule_and_the_optimizer_state(
        runs: tuple[Results, dict[str, Path]]) -> None:
    """Another trial's DCP checkpoint, loaded with other hparams: the lr ``__init__`` built wins, rescaled by the
    StepLR's progress (lr 0.01 decayed 4 times by batch 12 -> 0.03 decayed 4 times); AdamW's moments are kept."""
    results, _ = runs
    parent, child = results["resume_two"][0]["state"], results["pbt_child"]
    assert parent["lr"] == pytest.approx(0.01 * 0.7**4)
    for rank in child:
        assert rank["loaded"]["lr"] == pytest.approx(0.03 * 0.7**4)
        assert {k: v for k, v in rank["loaded"].items() if k != "lr"} == {k: v for k, v in parent.items() if k != "lr"}


def test_wrap_model_refuses_what_cannot_work(runs: tuple[Results, dict[str, Path]]) -> None:
    results, _ = runs
    for rank in results["errors"]:
        assert rank["ddp_refuses"] is not None  # torch's DDP does not take an FSDP2 model's DTensors
        assert rank["ddp_around"].startswith("TypeError: ") and "around an FSDP2" in rank["ddp_around"]
        assert rank["no_root"].startswith("TypeError: ") and "fully_shard(model) on the root" in rank["no_root"]
        assert rank["mix"].startswith("TypeError: ") and "both FSDP2" in rank["mix"]
        assert "validation loaders hold [1, 0] batches" in rank["uneven"]


def test_a_rank_that_cannot_prepare_its_shard_fails_every_rank_and_stores_nothing(
    runs: tuple[Results, dict[str, Path]],
) -> None:
    results, dirs = runs
    for rank in results["prepare_fails"]:
        assert rank["error"] is not None and "was not saved" in rank["error"], rank["error"]
    checkpoints = core.LocalStore(dirs["fails"]).checkpoints(trial_id=results["prepare_fails"][0]["trial_id"])
    assert checkpoints == []
    assert [p.name for p in (dirs["fails"] / "checkpoints").iterdir() if not p.name.startswith(".")] == []
