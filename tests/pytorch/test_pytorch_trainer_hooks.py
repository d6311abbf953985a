"""Trainer.fit callbacks: the full hook trace of a short run and of a resume, hook counts for epoch,
batch, record and explicit-point periods, and the checkpoint policies ("all", "best", "none")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trials_pytorch import LinearTrial, ScriptedValidationTrial, config, fit

from determined_trials.pytorch import Batch, Epoch, Record, TrainUnit

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)

STATE_KEYS = ["callbacks", "lr_schedulers_state_dict", "models_state_dict", "optimizers_state_dict",
              "rng_state", "scalers_state_dict"]


def _names(events: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Events with the bulky arguments (metrics, paths, uuids) dropped."""
    bulky = ("workload_end", "validation_end", "checkpoint_write_end", "checkpoint_upload_end",
             "checkpoint_load_start")
    return [(event[0],) if event[0] in bulky else event for event in events]


def _steps_at(events: list[tuple[Any, ...]], name: str) -> list[int]:
    """For each ``name`` event, how many batches had been trained (counting from 0)."""
    steps, batches = [], 0
    for event in events:
        if event[0] == "batch":
            batches = event[1] + 1
        elif event[0] == name:
            steps.append(batches)
    return steps


def _trace_run(run_dir: Path) -> tuple[LinearTrial, dict[str, Any]]:
    trial, _, info = fit(
        LinearTrial, config({"global_batch_size": 2}), run_dir,  # 8 records: 4 batches per epoch
        max_length=Batch(10), validation_period=Batch(4), checkpoint_period=Batch(6), reporting_period=Batch(3),
        checkpoint_policy="none",
    )
    return trial, info


CKPT = [("checkpoint_save_start",), ("checkpoint_write_end",), ("checkpoint_upload_end",)]
VAL = [("validation_start",), ("validation_end",)]


def test_full_hook_trace_of_a_short_run(tmp_path: Path) -> None:
    trial, info = _trace_run(tmp_path)
    expected = [
        ("startup", 0, None), ("training_start",),
        ("epoch_start", 0), ("batch", 0), ("batch", 1), ("batch", 2), ("workload_end",),
        ("batch", 3), ("epoch_end", 0), ("workload_end",), *VAL,
        ("epoch_start", 1), ("batch", 4), ("batch", 5), ("workload_end",), *CKPT,
        ("batch", 6), ("batch", 7), ("epoch_end", 1), ("workload_end",), *VAL,
        ("epoch_start", 2), ("batch", 8), ("workload_end",),
        ("batch", 9), ("workload_end",), *VAL, *CKPT,
        ("shutdown",),
    ]
    assert _names(trial.events) == expected
    assert _steps_at(trial.events, "workload_end") == [3, 4, 6, 8, 9, 10]
    # the arguments: workload metrics, validation metrics, the checkpoint folder and uuid
    workloads = [e[1] for e in trial.events if e[0] == "workload_end"]
    assert all(set(m) == {"loss"} for m in workloads)
    assert all(set(e[1]) == {"validation_loss"} for e in trial.events if e[0] == "validation_end")
    uuids = [e[1] for e in trial.events if e[0] == "checkpoint_upload_end"]
    assert uuids == [c.uuid for c in info["checkpoints"]]
    assert [c.steps_completed for c in info["checkpoints"]] == [6, 10]
    written = [e[1] for e in trial.events if e[0] == "checkpoint_write_end"]
    assert all(uuid in path for uuid, path in zip(uuids, written))


def test_hook_trace_on_resume(tmp_path: Path) -> None:
    first, info = _trace_run(tmp_path)
    uuid = info["checkpoints"][0].uuid  # taken after batch 6
    trial, _, _ = fit(
        LinearTrial, config({"global_batch_size": 2}), tmp_path,
        max_length=Batch(10), validation_period=Batch(4), checkpoint_period=Batch(6), reporting_period=Batch(3),
        checkpoint_policy="none", latest_checkpoint=uuid,
    )
    expected = [
        ("startup", 6, uuid), ("checkpoint_load_start",), ("callback_state_loaded", 1),
        ("training_start",),
        ("batch", 6), ("batch", 7), ("epoch_end", 1), ("workload_end",), *VAL,
        ("epoch_start", 2), ("batch", 8), ("workload_end",),
        ("batch", 9), ("workload_end",), *VAL, *CKPT,
        ("shutdown",),
    ]
    assert _names(trial.events) == expected
    loaded_keys = next(e[1] for e in trial.events if e[0] == "checkpoint_load_start")
    assert set(STATE_KEYS) <= set(loaded_keys)  # the hook sees the loaded state_dict.pth contents
    # ("callback_state_loaded", 1): the Recorder's state (validations so far) came from the checkpoint
    assert [e["w"] for e in trial.log] == [e["w"] for e in first.log[6:]]


@pytest.mark.parametrize(
    ("validation", "checkpoint", "length", "val_steps", "ckpt_steps"),
    [
        (Epoch(1), Epoch(2), Epoch(3), [4, 8, 12], [8, 12]),
        (Batch(5), Batch(5), Batch(12), [5, 10, 12], [5, 10, 12]),
        (Batch([2, 7]), Batch([3]), Batch(12), [2, 7, 12], [3, 12]),
        (Epoch([1, 3]), Epoch([2]), Epoch(3), [4, 12], [8, 12]),
        (Record(8), Record(12), Batch(12), [4, 8, 12], [6, 12]),  # global batch 2: 4 and 6 batches
        (None, None, Batch(6), [6], [6]),  # the end always validates and checkpoints
    ],
)
def test_validation_and_checkpoint_counts_for_periods(
    tmp_path: Path, validation: TrainUnit | None, checkpoint: TrainUnit | None, length: TrainUnit,
    val_steps: list[int], ckpt_steps: list[int],
) -> None:
    trial, _, info = fit(
        LinearTrial, config({"global_batch_size": 2}), tmp_path, max_length=length,
        validation_period=validation, checkpoint_period=checkpoint, checkpoint_policy="none",
    )
    assert _steps_at(trial.events, "validation_end") == val_steps
    assert _steps_at(trial.events, "validation_start") == val_steps
    assert _steps_at(trial.events, "checkpoint_upload_end") == ckpt_steps
    assert [c.steps_completed for c in info["checkpoints"]] == ckpt_steps
    assert [m.steps_completed for m in info["validation"]] == val_steps
    total = val_steps[-1]
    assert len([e for e in trial.events if e[0] == "epoch_start"]) == -(-total // 4)


def test_epoch_hooks_and_reporting_period_counts(tmp_path: Path) -> None:
    trial, _, info = fit(LinearTrial, config({"global_batch_size": 2}), tmp_path, max_length=Epoch(3),
                         reporting_period=Epoch(1))
    assert [e[1] for e in trial.events if e[0] == "epoch_start"] == [0, 1, 2]
    assert [e[1] for e in trial.events if e[0] == "epoch_end"] == [0, 1, 2]
    assert _steps_at(trial.events, "epoch_end") == [4, 8, 12]
    assert [m.steps_completed for m in info["training"]] == [4, 8, 12]
    assert [m.metrics["epochs"] for m in info["training"]] == [1, 2, 3]


@pytest.mark.parametrize(
    ("policy", "smaller_is_better", "steps"),
    [
        ("all", True, [8]),  # one after every validation; at the end GC keeps the latest and best (8), as the runner
        ("best", True, [2, 4, 8]),  # 3 (first), 1 (better), 2 (worse: none), 0.5 (better; also the end)
        ("best", False, [2, 8]),  # larger is better: only the first, then the end of training
        ("none", True, [8]),  # only the end of training
    ],
)
def test_checkpoint_policies(tmp_path: Path, policy: str, smaller_is_better: bool, steps: list[int]) -> None:
    conf = config({"global_batch_size": 2})
    conf["searcher"]["smaller_is_better"] = smaller_is_better
    trial, _, info = fit(
        lambda ctx: ScriptedValidationTrial(ctx, values=[3.0, 1.0, 2.0, 0.5]), conf, tmp_path,
        max_length=Batch(8), validation_period=Batch(2), checkpoint_policy=policy,
    )
    assert [m.metrics["validation_loss"] for m in info["validation"]] == [3.0, 1.0, 2.0, 0.5]
    assert [c.steps_completed for c in info["checkpoints"]] == steps
    stored = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if not p.name.startswith("."))
    assert stored == sorted(c.uuid for c in info["checkpoints"])
    for record in info["checkpoints"]:
        assert (tmp_path / "checkpoints" / record.uuid / "state_dict.pth").is_file()
    # a validation-triggered checkpoint comes right after its validation
    names = [e[0] for e in trial.events]
    if policy == "all":
        assert [c.steps_completed for c in trial.context._core.store.checkpoints(include_deleted=True)] == [2, 4, 6, 8]
        for i, name in enumerate(names):
            if name == "validation_end":
                assert names[i + 1] == "checkpoint_save_start"


def test_bad_checkpoint_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checkpoint_policy"):
        fit(LinearTrial, config(), tmp_path, max_length=Batch(2), checkpoint_policy="sometimes")
