"""The loop's checkpoint step in each ``SaveMode``, with plain-Python fake adapters (no torch, no
TensorFlow) under a real Core API context: which adapter methods run, in which order, on which thread
and on which ranks, when ``on_checkpoint_upload_end`` fires, and what the published checkpoint holds."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from determined_trials import core
from determined_trials.loop import Clock, DataShape, HookRunner, SaveMode, TrialAdapter
from determined_trials.loop._checkpointing import TRIAL_STATE_FILE, Checkpointer

MAIN = "main"  # a call on the training thread
WRITER = "writer"  # a call on the loop's checkpoint writer thread


class _Uploads:
    """A callback recording the storage ids ``on_checkpoint_upload_end`` reports."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        self.ids.append(uuid)


class _Fake(TrialAdapter):
    """An adapter that records the checkpoint calls the loop makes (with the thread of each) and writes
    one small file per rank; the training side is never used here."""

    framework = "fake-1"

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self.calls: list[tuple[str, str]] = []

    def _note(self, method: str) -> None:
        on_main = threading.current_thread() is threading.main_thread()
        self.calls.append((method, MAIN if on_main else WRITER))

    def _write(self, path: Path, what: str) -> None:
        (path / f"rank{self.rank}.txt").write_text(what)

    def prepare_checkpoint(self) -> None:
        self._note("prepare_checkpoint")

    def save(self, path: Path) -> None:
        self._note("save")
        self._write(path, "saved")

    def load(self, path: Path) -> None:
        raise AssertionError("not used by the checkpoint step")

    def start_training(self, state: Clock) -> DataShape:
        raise AssertionError("not used by the checkpoint step")

    def train(self, num_batches: int, state: Clock, should_stop: Any) -> None:
        raise AssertionError("not used by the checkpoint step")

    def stop_requested(self) -> bool:
        raise AssertionError("not used by the checkpoint step")

    def training_metrics(self) -> dict[str, Any]:
        raise AssertionError("not used by the checkpoint step")

    def validate(self, *, test_mode: bool = False) -> dict[str, Any]:
        raise AssertionError("not used by the checkpoint step")

    def close(self) -> None:
        raise AssertionError("not used by the checkpoint step")


class _SyncChief(_Fake):
    """The default mode: declares nothing."""


class _Sharded(_Fake):
    save_mode = SaveMode.SHARDED


class _Snapshots(_Fake):
    save_mode = SaveMode.ASYNC_SNAPSHOT

    def __init__(self, rank: int = 0, *, large: bool = True) -> None:
        super().__init__(rank)
        self.large = large

    def wants_snapshot(self) -> bool:
        self._note("wants_snapshot")
        return self.large

    def snapshot(self) -> Any:
        self._note("snapshot")
        return "copied"

    def write_snapshot(self, snapshot: Any, path: Path) -> None:
        self._note("write_snapshot")
        self._write(path, snapshot)


class _ShardedAsync(_Fake):
    """Each rank's shard write is a future: finished by the test (``release``) or by a thread of its own."""

    save_mode = SaveMode.ASYNC_SHARDED

    def __init__(self, rank: int = 0, *, held: bool = True) -> None:
        super().__init__(rank)
        self.held = held
        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._path: Path | None = None

    def start_sharded_save(self, path: Path) -> concurrent.futures.Future[Any]:
        self._note("start_sharded_save")
        if self.held:
            self._future, self._path = concurrent.futures.Future(), path
            return self._future
        return self._pool.submit(self._write, path, "shard")

    def release(self) -> None:
        assert self._path is not None
        self._write(self._path, "shard")
        self._future.set_result(None)


class _Liar(_Fake):
    """Declares a background mode without implementing its protocol."""

    def __init__(self, mode: SaveMode) -> None:
        super().__init__()
        self._mode = mode

    @property
    def save_mode(self) -> SaveMode:
        return self._mode


SAVED_NOW = [("prepare_checkpoint", MAIN), ("save", MAIN)]  # the adapter's calls of a synchronous checkpoint
CHIEF_FILES = {"rank0.txt", TRIAL_STATE_FILE, "metadata.json"}


@contextlib.contextmanager
def _checkpointing(run_dir: Path, adapter: TrialAdapter) -> Iterator[tuple[core.Context, Checkpointer, _Uploads]]:
    """A Core API context and the loop's checkpoint step over ``adapter``, closed on the way out."""
    with core.init(run_dir=run_dir) as ctx:
        checkpointer, uploads = _checkpointer(ctx, adapter)
        try:
            yield ctx, checkpointer, uploads
        finally:
            checkpointer.close()


def _checkpointer(ctx: core.Context, adapter: TrialAdapter) -> tuple[Checkpointer, _Uploads]:
    uploads = _Uploads()
    return Checkpointer(core=ctx, adapter=adapter, hooks=HookRunner({"uploads": uploads})), uploads


def _files(ctx: core.Context, storage_id: str) -> set[str]:
    return set(ctx.checkpoint.storage.list_files(storage_id))


def _state(batches: int) -> Clock:
    return Clock(batches_trained=batches, last_checkpoint=batches)


def test_sync_chief_saves_on_the_training_thread_and_fires_the_hook_at_once(tmp_path: Path) -> None:
    adapter = _SyncChief()
    with _checkpointing(tmp_path, adapter) as (ctx, checkpointer, uploads):
        checkpointer.save(_state(3))
        assert adapter.calls == SAVED_NOW and len(uploads.ids) == 1
        assert _files(ctx, uploads.ids[0]) == CHIEF_FILES
        assert ctx.checkpoint.storage.read_metadata(uploads.ids[0])["steps_completed"] == 3


def test_async_snapshot_copies_on_the_training_thread_and_writes_in_the_background(tmp_path: Path) -> None:
    adapter = _Snapshots(large=True)
    with _checkpointing(tmp_path, adapter) as (ctx, checkpointer, uploads):
        checkpointer.save(_state(2))
        assert uploads.ids == []  # the hook fires when the write is collected, on the training thread
        checkpointer.wait()
        assert adapter.calls == [("prepare_checkpoint", MAIN), ("wants_snapshot", MAIN), ("snapshot", MAIN),
                                 ("write_snapshot", WRITER)]
        assert len(uploads.ids) == 1
        assert (ctx.checkpoint.storage.path / uploads.ids[0] / "rank0.txt").read_text() == "copied"
        adapter.calls.clear()
        checkpointer.save(_state(4), final=True)  # nothing trains after it: saved at once, no copy
        assert adapter.calls == SAVED_NOW and len(uploads.ids) == 2 and _files(ctx, uploads.ids[1]) == CHIEF_FILES


def test_async_snapshot_of_a_small_state_saves_now_and_publishes_in_the_background(tmp_path: Path) -> None:
    adapter = _Snapshots(large=False)
    with _checkpointing(tmp_path, adapter) as (ctx, checkpointer, uploads):
        checkpointer.save(_state(2))
        assert adapter.calls == [("prepare_checkpoint", MAIN), ("wants_snapshot", MAIN), ("save", MAIN)]
        checkpointer.wait()
        assert len(uploads.ids) == 1 and (ctx.checkpoint.storage.path / uploads.ids[0] / "rank0.txt").exists()


def test_the_next_checkpoint_waits_for_the_write_in_flight(tmp_path: Path) -> None:
    adapter = _Snapshots(large=True)
    with _checkpointing(tmp_path, adapter) as (ctx, checkpointer, uploads):
        checkpointer.save(_state(2))
        checkpointer.save(_state(4))
        assert len(uploads.ids) == 1  # the first write was collected (its hook fired) before the second began
        checkpointer.wait()
        assert [ctx.checkpoint.storage.read_metadata(i)["steps_completed"] for i in uploads.ids] == [2, 4]
        assert [m for m, _ in adapter.calls].count("write_snapshot") == 2


def test_sharded_saves_into_a_shard_on_the_training_thread(tmp_path: Path) -> None:
    adapter = _Sharded()
    with _checkpointing(tmp_path, adapter) as (ctx, checkpointer, uploads):
        checkpointer.save(_state(1))
        assert adapter.calls == SAVED_NOW and len(uploads.ids) == 1 and _files(ctx, uploads.ids[0]) == CHIEF_FILES


def test_async_sharded_publishes_once_the_shard_write_is_done(tmp_path: Path) -> None:
    adapter = _ShardedAsync(held=True)
    with _checkpointing(tmp_path, adapter) as (ctx, checkpointer, uploads):
        checkpointer.save(_state(2))
        assert adapter.calls == [("prepare_checkpoint", MAIN), ("start_sharded_save", MAIN)]
        checkpointer.poll()
        assert uploads.ids == [] and ctx.checkpoint.storage.list_checkpoints() == []  # still writing
        adapter.release()
        checkpointer.wait()
        assert len(uploads.ids) == 1 and _files(ctx, uploads.ids[0]) == CHIEF_FILES
        adapter.calls.clear()
        checkpointer.save(_state(4), final=True)  # the last checkpoint: every rank saves its shard now
        assert adapter.calls == SAVED_NOW and len(uploads.ids) == 2


@pytest.mark.parametrize(("mode", "protocol"), [(SaveMode.ASYNC_SNAPSHOT, "SnapshotSaver"),
                                                (SaveMode.ASYNC_SHARDED, "ShardedAsyncSaver")])
def test_a_background_mode_without_its_protocol_is_refused(tmp_path: Path, mode: SaveMode, protocol: str) -> None:
    adapter = _Liar(mode)
    with _checkpointing(tmp_path, adapter) as (_, checkpointer, uploads):
        with pytest.raises(TypeError, match=f"declares SaveMode.{mode.name} but does not implement {protocol}"):
            checkpointer.save(_state(1))
        checkpointer.save(_state(2), final=True)  # saved synchronously: only `save` is needed
        assert [m for m, _ in adapter.calls] == ["prepare_checkpoint", "prepare_checkpoint", "save"]
        assert len(uploads.ids) == 1


def test_the_modes_flags() -> None:
    assert [m for m in SaveMode if m.sharded] == [SaveMode.SHARDED, SaveMode.ASYNC_SHARDED]
    assert [m for m in SaveMode if m.background] == [SaveMode.ASYNC_SNAPSHOT, SaveMode.ASYNC_SHARDED]
    assert _SyncChief().save_mode is SaveMode.SYNC_CHIEF and _SyncChief().batch_metrics() == []


# -- two ranks (real processes) ------------------------------------------------------------------

_RANK_ADAPTERS = {
    "sync_chief": lambda rank: _SyncChief(rank),
    "sharded": lambda rank: _Sharded(rank),
    "async_snapshot": lambda rank: _Snapshots(rank),
    "async_sharded": lambda rank: _ShardedAsync(rank, held=False),
}


def _rank_saves_in_every_mode(dist: Any, run_dir: str) -> dict[str, Any]:
    """One rank: a checkpoint in each mode (collected before the next); the methods called, the ids the
    hook reported and the files of each checkpoint."""
    out: dict[str, Any] = {}
    with core.init(distributed=dist, run_dir=run_dir) as ctx:
        for batches, (name, make) in enumerate(_RANK_ADAPTERS.items(), start=1):
            adapter = make(dist.get_rank())
            checkpointer, uploads = _checkpointer(ctx, adapter)
            checkpointer.save(_state(batches))
            checkpointer.wait()
            checkpointer.close()
            files = sorted(_files(ctx, uploads.ids[0])) if dist.get_rank() == 0 else None
            out[name] = {"calls": adapter.calls, "ids": uploads.ids, "files": files}
    return out


@pytest.mark.slow
def test_each_mode_calls_the_adapter_on_the_right_ranks(tmp_path: Path) -> None:
    from determined_trials.testing import run_ranks

    chief, worker = run_ranks(_rank_saves_in_every_mode, 2, args=(str(tmp_path),), timeout=120)
    for name in _RANK_ADAPTERS:
        assert chief[name]["ids"] == worker[name]["ids"] and len(chief[name]["ids"]) == 1, name
    assert chief["sync_chief"]["calls"] == SAVED_NOW
    assert worker["sync_chief"]["calls"] == [("prepare_checkpoint", MAIN)]
    assert chief["sync_chief"]["files"] == ["metadata.json", "rank0.txt", TRIAL_STATE_FILE]
    assert chief["async_snapshot"]["calls"] == [("prepare_checkpoint", MAIN), ("wants_snapshot", MAIN),
                                                ("snapshot", MAIN), ("write_snapshot", WRITER)]
    assert worker["async_snapshot"]["calls"] == [("prepare_checkpoint", MAIN)]
    assert chief["async_snapshot"]["files"] == ["metadata.json", "rank0.txt", TRIAL_STATE_FILE]
    for rank in (chief, worker):
        assert rank["sharded"]["calls"] == SAVED_NOW
        assert rank["async_sharded"]["calls"] == [("prepare_checkpoint", MAIN), ("start_sharded_save", MAIN)]
    for name in ("sharded", "async_sharded"):
        assert chief[name]["files"] == ["metadata.json", "rank0.txt", "rank1.txt", TRIAL_STATE_FILE], name
