"""The loop alone, with plain functions: the full hook order of a run (docs: "Hook order"), with the
adapter's calls between the hooks, and that running the loop imports no framework."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from plain_adapter import Event, run_loop

from determined_trials.loop import Batch, ExitReason

VAL = [("validation_start",), ("validate",), ("validation_end",)]
CKPT = [("prepare_checkpoint",), ("save",), ("write",), ("upload_end",)]
_BULKY = ("validation_end", "upload_end", "save", "write")


def _short(events: list[Event]) -> list[Event]:
    """Events with the bulky arguments (metrics, weights, uuids) dropped."""
    return [(e[0],) if e[0] in _BULKY else e for e in events]


def test_the_hooks_and_adapter_calls_of_a_whole_run_come_in_the_documented_order(tmp_path: Path) -> None:
    # 8 records in batches of 2: 4 batches per epoch. Boundaries: reports at 3, 6, 9, validations at 4, 8,
    # a checkpoint at 6, the end at 10 (validated and checkpointed).
    run = run_loop(tmp_path, max_length=Batch(10), validation_period=Batch(4), checkpoint_period=Batch(6),
                   reporting_period=Batch(3))
    assert run.reason is ExitReason.COMPLETED
    assert _short(run.events) == [
        ("startup", 0, None), ("start_training", 0), ("training_start",),
        ("epoch_start", 0), ("batch", 0), ("batch", 1), ("batch", 2), ("workload_end",),
        # an epoch's end comes right after its last batch, before the boundary's workload end and validation
        ("batch", 3), ("epoch_end", 0), ("workload_end",), *VAL,
        ("epoch_start", 1), ("batch", 4), ("batch", 5), ("workload_end",), *CKPT,
        ("batch", 6), ("batch", 7), ("epoch_end", 1), ("workload_end",), *VAL,
        ("epoch_start", 2), ("batch", 8), ("workload_end",),
        ("batch", 9), ("workload_end",), *VAL, *CKPT,  # the end: validated, then checkpointed
        ("close",), ("shutdown",),
    ]
    uuids = [e[1] for e in run.events if e[0] == "upload_end"]
    assert uuids == [c.uuid for c in run.checkpoints]
    assert [c.steps_completed for c in run.checkpoints] == [6, 10]
    # each validation hook sees the metrics of the model as trained so far; the save writes that model
    assert [e[1] for e in run.events if e[0] == "validation_end"] == [
        m.metrics["validation_loss"] for m in run.validation]
    assert [m.steps_completed for m in run.validation] == [4, 8, 10]
    assert [m.steps_completed for m in run.training] == [3, 4, 6, 8, 9, 10]
    assert [(m.metrics["batches"], m.metrics["epochs"]) for m in run.training] == [
        (3, 0), (4, 1), (6, 1), (8, 2), (9, 2), (10, 2)]


def test_step_zero_validation_comes_before_the_first_epoch(tmp_path: Path) -> None:
    run = run_loop(tmp_path, max_length=Batch(2), step_zero_validation=True)
    assert _short(run.events) == [
        ("startup", 0, None), ("start_training", 0), ("training_start",), *VAL,
        ("epoch_start", 0), ("batch", 0), ("batch", 1), ("workload_end",), *VAL, *CKPT,
        ("close",), ("shutdown",),
    ]
    assert [m.steps_completed for m in run.validation] == [0, 2]


def test_the_shutdown_hook_and_close_run_when_a_hook_raises(tmp_path: Path) -> None:
    def fail(adapter: object, batches: int) -> None:
        if batches == 3:
            raise RuntimeError("boom")

    events: list[Event] = []
    try:
        run_loop(tmp_path, max_length=Batch(10), after_batch=fail, events=events)
    except RuntimeError as err:
        assert str(err) == "boom"
    else:
        raise AssertionError("the error was swallowed")
    assert _short(events)[-3:] == [("batch", 2), ("close",), ("shutdown",)]


def test_running_the_loop_imports_no_framework(tmp_path: Path) -> None:
    """Every save mode and a resume, in a fresh interpreter: no torch, TensorFlow, Keras or DeepSpeed."""
    script = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from pathlib import Path
from plain_adapter import SaveMode, run_loop
from determined_trials.loop import Batch
for mode in SaveMode:
    run = run_loop(Path({str(tmp_path)!r}) / mode.value, mode=mode, max_length=Batch(3), checkpoint_period=Batch(1))
    run_loop(Path({str(tmp_path)!r}) / mode.value, latest_checkpoint=run.checkpoints[0].uuid, max_length=Batch(4))
print(json.dumps(sorted(sys.modules)))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    loaded = {name.split(".")[0] for name in json.loads(out.stdout.strip().splitlines()[-1])}
    assert "determined_trials" in loaded
    assert not loaded & {"torch", "tensorflow", "keras", "deepspeed"}


def test_at_the_last_batch_the_validation_comes_before_the_checkpoint(tmp_path: Path) -> None:
    run = run_loop(tmp_path, max_length=Batch(6), validation_period=Batch(4), checkpoint_period=Batch(3))
    assert _short(run.events)[-10:] == [("workload_end",), *VAL, *CKPT, ("close",), ("shutdown",)]
    last = run.stored[run.checkpoints[-1].uuid]
    assert last.model["callbacks"]["recorder"]["validations"] == 2  # the hooks of both validations (4, 6)
    assert last.trial_state["last_validation"] == 6
