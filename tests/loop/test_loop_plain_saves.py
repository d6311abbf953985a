"""The loop's save modes, with plain functions: the chief alone, a snapshot written in the background, a small
state published in the background, every rank's shard, and shards written in the background. Each writes
loadable checkpoints holding ``trial_state.json`` and calls the adapter's methods in its order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from plain_adapter import PlainRun, SaveMode, run_loop

from determined_trials.loop import TRIAL_STATE_FILE, Batch

CHECKPOINTED = [2, 4, 6]  # checkpoint_period=Batch(2), max_length=Batch(6): the last one is final
SAVE_CALLS = ("prepare_checkpoint", "save", "snapshot", "write_snapshot", "start_sharded_save", "write", "upload_end")
WRITER = "det-checkpoint-writer"
SHARD_WRITER = "plain-shard-writer"

SYNC = ["prepare_checkpoint", "save", "write", "upload_end"]  # all on the training thread
ORDER = {
    SaveMode.SYNC: [SYNC, SYNC],
    # the snapshot on the training thread, serialised on the writer; the final checkpoint written at once
    SaveMode.SNAPSHOT: [["prepare_checkpoint", "snapshot", "write_snapshot", "write", "upload_end"], SYNC],
    # a small state saved on the training thread, only published on the writer
    SaveMode.STAGED: [SYNC, SYNC],
    SaveMode.SHARDED: [SYNC, SYNC],
    # the shard written by the adapter's own thread, collected and committed by the loop
    SaveMode.ASYNC_SHARDED: [["prepare_checkpoint", "start_sharded_save", "write", "upload_end"], SYNC],
}
THREADS = {
    SaveMode.SYNC: {"save": "MainThread", "write": "MainThread"},
    SaveMode.SNAPSHOT: {"snapshot": "MainThread", "write_snapshot": WRITER, "save": "MainThread"},
    SaveMode.STAGED: {"save": "MainThread"},
    SaveMode.SHARDED: {"save": "MainThread", "write": "MainThread"},
    SaveMode.ASYNC_SHARDED: {"start_sharded_save": "MainThread", "save": "MainThread"},
}


def _save_calls(run: PlainRun) -> list[list[str]]:
    """The checkpoint calls of the run, one list per checkpoint (each ends with its upload hook)."""
    per_checkpoint: list[list[str]] = [[]]
    for event in run.events:
        if event[0] in SAVE_CALLS:
            per_checkpoint[-1].append(event[0])
            if event[0] == "upload_end":
                per_checkpoint.append([])
    assert per_checkpoint.pop() == []
    return per_checkpoint


def _batches_while_writing(run: PlainRun) -> list[int]:
    """For each checkpoint, how many batches were trained between its start and its upload hook."""
    counts: list[int] = []
    writing: int | None = None
    for event in run.events:
        if event[0] == "prepare_checkpoint":
            writing = 0
        elif event[0] == "batch" and writing is not None:
            writing += 1
        elif event[0] == "upload_end":
            assert writing is not None
            counts.append(writing)
            writing = None
    return counts


def _contents(run: PlainRun) -> list[tuple[list[str], dict[str, int], dict[str, Any]]]:
    result = []
    for checkpoint in run.checkpoints:
        stored = run.stored[checkpoint.uuid]
        state = {k: v for k, v in stored.trial_state.items() if k != "trial_id"}
        result.append(([f for f in stored.files if not f.startswith("shard-")], state, stored.model))
    return result


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory: pytest.TempPathFactory) -> PlainRun:
    return run_loop(tmp_path_factory.mktemp("sync"), max_length=Batch(6), checkpoint_period=Batch(2))


@pytest.mark.parametrize("mode", list(SaveMode), ids=[m.value for m in SaveMode])
def test_each_save_mode_writes_loadable_checkpoints_in_its_order(tmp_path: Path, sync_run: PlainRun,
                                                                  mode: SaveMode) -> None:
    run = run_loop(tmp_path, mode=mode, max_length=Batch(6), checkpoint_period=Batch(2))
    assert [c.steps_completed for c in run.checkpoints] == CHECKPOINTED
    assert [e[1] for e in run.events if e[0] == "upload_end"] == [c.uuid for c in run.checkpoints]
    assert all(c.metadata["framework"] == "plain" for c in run.checkpoints)
    calls = _save_calls(run)
    assert calls == [ORDER[mode][0], ORDER[mode][0], ORDER[mode][1]]
    # training goes on while a background write runs (its hook fires at a later boundary); never at the end
    background = mode in (SaveMode.SNAPSHOT, SaveMode.STAGED, SaveMode.ASYNC_SHARDED)
    assert [n > 0 for n in _batches_while_writing(run)] == [background, background, False]
    for call, thread in THREADS[mode].items():
        assert run.adapter.threads[call].startswith(thread), (call, run.adapter.threads)
    # the same files, counters and model as the chief's synchronous saves, each model that of its batch
    contents = _contents(run)
    assert contents == _contents(sync_run)
    assert all(TRIAL_STATE_FILE in files for files, _, _ in contents)
    shards = [[f for f in run.stored[c.uuid].files if f.startswith("shard-")] for c in run.checkpoints]
    assert shards == [["shard-0.json"] if run.adapter.sharded_save else []] * len(CHECKPOINTED)
    assert [state["batches_trained"] for _, state, _ in contents] == CHECKPOINTED
    weights = [e[1] for e in run.events if e[0] in ("save", "snapshot", "start_sharded_save")]
    assert [model["w"] for _, _, model in contents] == weights


@pytest.mark.parametrize("mode", list(SaveMode), ids=[m.value for m in SaveMode])
def test_each_save_mode_resumes_to_the_uninterrupted_model(tmp_path: Path, sync_run: PlainRun, mode: SaveMode) -> None:
    first = run_loop(tmp_path, mode=mode, max_length=Batch(6), checkpoint_period=Batch(2))
    middle = first.checkpoints[1]  # after batch 4: written in the background where the mode does
    second = run_loop(tmp_path, mode=mode, latest_checkpoint=middle.uuid, max_length=Batch(6),
                      checkpoint_period=Batch(2))
    assert second.events[1] == ("load", first.stored[middle.uuid].model["w"])
    assert first.adapter.trained[:4] + second.adapter.trained == sync_run.adapter.trained
    assert second.adapter.w == sync_run.adapter.w


@pytest.mark.parametrize("mode", [SaveMode.SNAPSHOT, SaveMode.STAGED, SaveMode.ASYNC_SHARDED],
                         ids=["snapshot", "staged", "async-sharded"])
def test_a_stop_waits_for_the_background_write_and_checkpoints_once_more(tmp_path: Path, mode: SaveMode) -> None:
    def stop(adapter: Any, trained: int) -> None:
        adapter.stop = trained == 3

    run = run_loop(tmp_path, mode=mode, max_length=Batch(6), checkpoint_period=Batch(2), after_batch=stop)
    assert [c.steps_completed for c in run.checkpoints] == [2, 3]
    assert _save_calls(run) == [ORDER[mode][0], ORDER[mode][1]]  # the stop's checkpoint is final: written at once
    assert run.events[-2:] == [("close",), ("shutdown",)]


@pytest.mark.parametrize("mode", list(SaveMode), ids=[m.value for m in SaveMode])
def test_the_last_write_is_collected_before_the_run_ends(tmp_path: Path, mode: SaveMode) -> None:
    # Trained through the searcher's operation (no max_length): the checkpoint at its end is a periodic one,
    # written in the background where the mode does; run() waits for it and fires its hook.
    config = {"searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 4}}}
    run = run_loop(tmp_path, mode=mode, config=config, checkpoint_period=Batch(2), searcher_metric="validation_loss")
    assert [c.steps_completed for c in run.checkpoints] == [2, 4]
    assert _save_calls(run) == [ORDER[mode][0], ORDER[mode][0]]
    assert [e[1] for e in run.events if e[0] == "upload_end"] == [c.uuid for c in run.checkpoints]
    assert run.events[-2:] == [("close",), ("shutdown",)]
