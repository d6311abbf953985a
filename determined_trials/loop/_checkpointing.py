"""The loop's checkpoint step, in the way the adapter's ``SaveMode`` declares: synchronous (the chief, or
every rank into its shard), or in the background while training goes on: a large state as a host-memory
snapshot taken on the training thread and written by one background writer (serialise, fsync, publish,
record); a small one serialised on the training thread and only fsynced, published and recorded by the
writer; a sharded state written by every rank in the background and published once all are done.

At most one write is in flight: the next checkpoint, a stop, preemption and the end of ``run``
wait for it. ``on_checkpoint_upload_end`` fires on the training thread when a write is collected,
once per checkpoint and in order; a writer's exception is raised there, on every rank.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from determined_trials.loop._adapter import SaveMode, ShardedAsyncSaver, SnapshotSaver, TrialAdapter
from determined_trials.loop._clock import Clock
from determined_trials.loop._hooks import HookRunner

if TYPE_CHECKING:
    from determined_trials.core import Context

__all__ = ["CHECKPOINT_FORMAT", "TRIAL_STATE_FILE", "Checkpointer"]

logger = logging.getLogger("determined_trials.loop")

TRIAL_STATE_FILE = "trial_state.json"
CHECKPOINT_FORMAT = "determined_trials/1"


def _snapshot_saver(adapter: TrialAdapter) -> SnapshotSaver:
    """``adapter`` as the ``SnapshotSaver`` that its ``SaveMode.ASYNC_SNAPSHOT`` declares it is."""
    if not isinstance(adapter, SnapshotSaver):
        raise TypeError(f"{type(adapter).__name__} declares SaveMode.ASYNC_SNAPSHOT but does not implement "
                        "SnapshotSaver (wants_snapshot, snapshot, write_snapshot)")
    return adapter


def _sharded_saver(adapter: TrialAdapter) -> ShardedAsyncSaver:
    """``adapter`` as the ``ShardedAsyncSaver`` that its ``SaveMode.ASYNC_SHARDED`` declares it is."""
    if not isinstance(adapter, ShardedAsyncSaver):
        raise TypeError(f"{type(adapter).__name__} declares SaveMode.ASYNC_SHARDED but does not implement "
                        "ShardedAsyncSaver (start_sharded_save)")
    return adapter


class Checkpointer:
    """Writes the loop's checkpoints through the Core API, off the training path when it can."""

    def __init__(self, *, core: Context, adapter: TrialAdapter, hooks: HookRunner) -> None:
        self._core = core
        self._adapter = adapter
        self._hooks = hooks
        self._dist = core.distributed
        self._is_chief = self._dist.get_rank() == 0
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._future: concurrent.futures.Future[str] | None = None
        self._in_flight = False  # on every rank: a write was started and not yet collected
        self._shard: tuple[Any, Any] | None = None  # (staged checkpoint, this rank's write future): sharded

    def save(self, state: Clock, *, final: bool = False) -> None:
        """Checkpoint ``state`` and the adapter's state (waits for the previous write first). A
        ``final`` checkpoint (nothing trains after it) is written at once from the live state: a
        snapshot would only add a copy, since the loop would wait for the writer right after."""
        self.wait()
        self._adapter.prepare_checkpoint()  # every rank, before any saving (e.g. gathering the ranks' data positions)
        mode = self._adapter.save_mode
        metadata = {"steps_completed": state.batches_trained, "framework": self._adapter.framework,
                    "format": CHECKPOINT_FORMAT}
        trial_state = json.dumps(state.state_dict(), indent=1)
        if final or not mode.background:
            self._save_now(metadata, trial_state, sharded=mode.sharded)
        elif mode is SaveMode.ASYNC_SHARDED:
            self._start_sharded(_sharded_saver(self._adapter), metadata, trial_state)
        else:
            if self._is_chief:
                self._future = self._start_background_save(_snapshot_saver(self._adapter), metadata, trial_state)
            self._in_flight = True

    def _save_now(self, metadata: dict[str, Any], trial_state: str, *, sharded: bool) -> None:
        """On the training thread: the chief (or every rank, ``sharded``) saves, then the hook fires."""
        storage_id = None
        if self._is_chief or sharded:
            if self._is_chief:
                self._core.train.set_status("checkpointing")
            with self._core.checkpoint.store_path(metadata, shard=sharded) as (path, storage_id):
                if self._is_chief:
                    (path / TRIAL_STATE_FILE).write_text(trial_state)
                self._adapter.save(path)
            if self._is_chief:
                self._core.train.set_status("training")
        if self._dist.get_size() > 1 and not sharded:
            storage_id = self._dist.broadcast(storage_id)
        self._hooks.call("on_checkpoint_upload_end", storage_id)

    def poll(self) -> None:
        """Collect a finished write without waiting (every rank calls; one broadcast with several)."""
        if not self._in_flight:
            return
        if self._shard is not None:  # every rank's own write: done when all are; then the chief commits
            done = self._shard[1].done()
            if self._dist.get_size() > 1:
                done = all(self._dist.allgather(done))
            if done:
                self._finish_sharded()
            return
        done = self._future is not None and self._future.done()
        if self._dist.get_size() > 1:
            done = bool(self._dist.broadcast(done if self._is_chief else None))
        if done:
            self.wait()

    def wait(self) -> None:
        """Wait for the write in flight (if any), fire its hook; re-raise its error on every rank."""
        if not self._in_flight:
            return
        if self._shard is not None:
            self._finish_sharded()  # then wait for the chief's commit below
        outcome: tuple[BaseException | None, str | None] = (None, None)
        if self._future is not None:
            try:
                outcome = (None, self._future.result())
            except Exception as exc:  # noqa: BLE001 - raised below, on every rank
                outcome = (exc, None)
            self._future = None
        if self._dist.get_size() > 1:
            sent = (None if outcome[0] is None else RuntimeError(f"checkpoint writer failed: {outcome[0]!r}"),
                    outcome[1])
            received = self._dist.broadcast(sent if self._is_chief else None)
            outcome = outcome if self._is_chief else received
        self._in_flight = False
        if outcome[0] is not None:
            raise outcome[0]
        self._hooks.call("on_checkpoint_upload_end", outcome[1])

    def close(self) -> None:
        """After an error: let a write in flight finish (the checkpoint stays valid), then stop the writer."""
        if self._future is not None:
            try:
                self._future.result()
            except Exception as exc:  # noqa: BLE001 - an earlier error is already propagating
                logger.error("the background checkpoint write failed too: %r", exc)
            self._future = None
        if self._shard is not None:  # no collective here: the staged shard is cleared at the next start
            try:
                self._shard[1].result()
            except Exception as exc:  # noqa: BLE001 - an earlier error is already propagating
                logger.error("the background checkpoint write failed too: %r", exc)
            self._shard = None
        self._in_flight = False
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _writer(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="det-checkpoint-writer")
        return self._executor

    def _start_sharded(self, saver: ShardedAsyncSaver, metadata: dict[str, Any], trial_state: str) -> None:
        """Every rank: stage its shard and let the adapter write it in the background."""
        if self._is_chief:
            self._core.train.set_status("checkpointing")
        staged = self._core.checkpoint.stage_shard(metadata)
        try:
            if self._is_chief:
                (staged.path / TRIAL_STATE_FILE).write_text(trial_state)
            future = saver.start_sharded_save(staged.path)
        except Exception:
            staged.abort()  # tells the other ranks (they publish and fail), then raises here
            raise
        self._shard = (staged, future)
        self._in_flight = True
        if self._is_chief:
            self._core.train.set_status("training")

    def _finish_sharded(self) -> None:
        """Every rank: its write is done; check every rank's files together (or fail together) and let
        the chief's writer thread commit and record the checkpoint, collected like any background write."""
        assert self._shard is not None
        staged, future = self._shard
        self._shard = None
        self._in_flight = False
        try:
            future.result()
        except Exception as exc:  # noqa: BLE001 - every rank raises below
            logger.error("writing this rank's checkpoint shard failed: %r", exc)
            staged.abort()
            raise
        commit = staged.collect()
        if commit is not None:
            self._future = self._writer().submit(commit)
        self._in_flight = True

    def _start_background_save(self, saver: SnapshotSaver, metadata: dict[str, Any],
                               trial_state: str) -> concurrent.futures.Future[str]:
        """A large state: snapshot it and let the writer serialise, publish and record it. A small one:
        serialise it now (a copy and a hand-off would cost more) and let the writer fsync, publish and
        record it."""
        if saver.wants_snapshot():
            return self._writer().submit(self._write, saver, metadata, trial_state, saver.snapshot())
        staged = self._core.checkpoint.stage(metadata)
        try:
            (staged.path / TRIAL_STATE_FILE).write_text(trial_state)
            self._adapter.save(staged.path)
        except BaseException:
            staged.abort()
            raise
        return self._writer().submit(staged.publish)

    def _write(self, saver: SnapshotSaver, metadata: dict[str, Any], trial_state: str, snapshot: Any) -> str:
        """On the writer thread: serialise the snapshot, then publish and record it (fsynced by storage)."""
        with self._core.checkpoint.store_path(metadata) as (path, storage_id):
            Path(path, TRIAL_STATE_FILE).write_text(trial_state)
            saver.write_snapshot(snapshot, path)
        return str(storage_id)
