"""CheckpointContext: save (upload, store_path) and load (download, restore_path) checkpoints, sharded or not."""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from determined_trials.core._checkpoint_helpers import (
    Outcome,
    attempt,
    check_metadata,
    checkpoint_files,
    jsonable,
    merge_plans,
    portable,
    unwrap,
    warn_metadata_replaced,
)
from determined_trials.core._staged import StagedCheckpoint, StagedShard
from determined_trials.core.storage import METADATA_FILE, Selector, StorageManager

if TYPE_CHECKING:
    from determined_trials.core._distributed import DistributedContext

__all__ = ["CheckpointContext", "CheckpointRecorder", "DownloadMode"]

logger = logging.getLogger("determined_trials.core")



class DownloadMode(enum.Enum):
    """Who downloads in ``download``/``restore_path`` when several ranks share a machine."""

    LocalWorkersShareDownload = "LocalWorkersShareDownload"
    """All ranks call; only local rank 0 of each machine downloads, the others use its copy."""
    NoSharedDownload = "NoSharedDownload"
    """Every rank downloads for itself (and need not call in step with the others)."""


class CheckpointRecorder(Protocol):
    """Told about saved and deleted checkpoints (the local store implements it). A recorder subclasses
    this protocol to inherit the no-op defaults of ``checkpoint_pending`` and ``checkpoint_dropped``.
    """

    def checkpoint_saved(self, storage_id: str, metadata: dict[str, Any], resources: dict[str, int]) -> None: ...

    def checkpoint_deleted(self, storage_id: str) -> None: ...

    def checkpoint_pending(self, storage_id: str, metadata: dict[str, Any]) -> None:
        """Before anything is staged (chief): a pending checkpoint whose writer died is settled at the next
        start (``recover_checkpoints``), published or not. Default: nothing recorded."""
        return None

    def checkpoint_dropped(self, storage_id: str) -> None:
        """The save of a pending checkpoint failed. Default: nothing recorded."""
        return None


class _LoggingRecorder(CheckpointRecorder):
    """The recorder used when none is given: it only logs."""

    def checkpoint_saved(self, storage_id: str, metadata: dict[str, Any], resources: dict[str, int]) -> None:
        logger.info("saved checkpoint %s (%d files)", storage_id, len(resources))

    def checkpoint_deleted(self, storage_id: str) -> None:
        logger.info("deleted checkpoint %s", storage_id)


class CheckpointContext:
    """Saves and loads checkpoints in a StorageManager; a checkpoint is visible only once complete.

    ``metadata`` must hold ``steps_completed``; it is stored as ``metadata.json``, the mark of a
    complete checkpoint (directory storage publishes by renaming the fsynced folder; S3 uploads it last).
    With ``shard=False`` only the chief saves; with ``shard=True`` every rank calls (a
    synchronisation point) and the checkpoint is the union of the ranks' files.
    """

    def __init__(
        self, dist: DistributedContext, storage: StorageManager, *, recorder: CheckpointRecorder | None = None
    ) -> None:
        self._dist = dist
        self._storage = storage
        self._recorder: CheckpointRecorder = recorder if recorder is not None else _LoggingRecorder()

    @property
    def storage(self) -> StorageManager:
        """The storage backend checkpoints are written to."""
        return self._storage

    # -- saving ------------------------------------------------------------------------------------
    def upload(
        self,
        ckpt_dir: str | os.PathLike[str] | None,
        metadata: dict[str, Any] | None = None,
        *,
        shard: bool = False,
        selector: Selector | None = None,
    ) -> str:
        """Store the (selected) files of ``ckpt_dir`` as a new checkpoint; return its storage id."""
        src = Path(ckpt_dir) if ckpt_dir is not None else None
        if not shard:
            self._require_chief("upload")
            md = check_metadata(metadata)
            files = checkpoint_files(src, selector)
            storage_id = str(uuid.uuid4())
            self._pending(storage_id, md)
            self._save_single(storage_id, md, lambda: self._put(storage_id, src, files))
            return storage_id
        storage_id = self._broadcast_id(metadata)
        plan = attempt(lambda: {"files": checkpoint_files(src, selector), "metadata": jsonable(metadata)})
        self._save_sharded(storage_id, src, plan)
        return storage_id

    @contextlib.contextmanager
    def store_path(self, metadata: dict[str, Any] | None = None, *, shard: bool = False) -> Iterator[tuple[Path, str]]:
        """Yield ``(path, storage_id)``: write the checkpoint into ``path``; it is stored on exit.

        If the block raises, nothing is stored and the partial files are removed.
        """
        rank = self._dist.get_rank()
        if not shard:
            staged = self.stage(metadata)
            try:
                yield staged.path, staged.storage_id
            except BaseException:
                staged.abort()
                raise
            staged.publish()
            return
        storage_id = self._broadcast_id(metadata)
        path = self._storage.stage_dir(storage_id, rank)
        try:
            yield path, storage_id
        except Exception as exc:
            with contextlib.suppress(Exception):  # tell the other ranks, then raise our own error
                self._save_sharded(storage_id, path, (portable(exc), None))
            raise
        except BaseException:
            self._storage.release(storage_id, rank)
            raise
        plan = attempt(lambda: {"files": checkpoint_files(path, None), "metadata": jsonable(metadata)})
        self._save_sharded(storage_id, path, plan)

    def stage_shard(self, metadata: dict[str, Any] | None = None) -> StagedShard:
        """Every rank: ``store_path(shard=True)`` in steps, so that the ranks' files may be written, and
        the checkpoint committed, in the background: write into the returned ``path``, then ``collect()``
        (a collective) and run the chief's commit anywhere, or ``abort()`` (a collective)."""
        storage_id = self._broadcast_id(metadata)
        rank = self._dist.get_rank()
        path = self._storage.stage_dir(storage_id, rank)

        def collect() -> Callable[[], str] | None:
            plan = attempt(lambda: {"files": checkpoint_files(path, None), "metadata": jsonable(metadata)})
            return self._collect_sharded(storage_id, path, plan)

        def abort() -> None:
            reason = RuntimeError(f"checkpoint {storage_id} was not saved: rank {rank} gave up on its shard")
            self._save_sharded(storage_id, path, (reason, None))

        return StagedShard(path, storage_id, collect, abort)

    def _collect_sharded(self, storage_id: str, src: Path, plan: Outcome) -> Callable[[], str] | None:
        """``_save_sharded`` up to the chief's commit, which it returns (None on the other ranks)."""
        metadata, staged, results = self._agree_and_stage(storage_id, src, plan)
        chief = self._dist.get_rank() == 0
        self._raise_for(staged, self._staging_failed(storage_id, results) if chief else None)
        if not chief:
            return None

        def commit() -> str:
            committed = attempt(lambda: self._storage.commit(storage_id, metadata))
            if committed[0] is not None:
                self._storage.abort(storage_id)
                self._dropped(storage_id)
                raise committed[0]
            self._recorder.checkpoint_saved(storage_id, metadata, committed[1])
            return storage_id

        return commit

    def stage(self, metadata: dict[str, Any] | None) -> StagedCheckpoint:
        """Chief only: ``store_path`` in two steps. Write the checkpoint's files into the returned
        ``path``, then ``publish()`` it (possibly on another thread) or ``abort()``."""
        self._require_chief("store_path")
        md = check_metadata(metadata)
        storage_id = str(uuid.uuid4())
        self._pending(storage_id, md)
        path = self._storage.stage_dir(storage_id, 0)

        def abort() -> None:
            self._storage.release(storage_id, 0)
            self._storage.abort(storage_id)
            self._dropped(storage_id)

        def publish() -> None:
            self._save_single(storage_id, md, lambda: self._stage_written(storage_id, path))

        return StagedCheckpoint(path, storage_id, publish, abort)

    def _stage_written(self, storage_id: str, path: Path) -> None:
        """Stage what the ``store_path`` block wrote into ``path`` (nothing to copy when it was written
        into the storage's own staging folder; its metadata.json is replaced at commit either way)."""
        if not self._storage.stages_in_place:
            self._put(storage_id, path, checkpoint_files(path, None))
        elif (path / METADATA_FILE).exists():
            warn_metadata_replaced(path)

    def _put(self, storage_id: str, src: Path | None, files: dict[str, int]) -> None:
        if src is not None and files:
            self._storage.put(storage_id, self._dist.get_rank(), src, list(files))

    def _pending(self, storage_id: str, metadata: Mapping[str, Any] | None) -> None:
        """Record the checkpoint as pending before anything is staged (chief), so a crash can be settled."""
        self._recorder.checkpoint_pending(storage_id, jsonable(metadata))

    def _dropped(self, storage_id: str) -> None:
        self._recorder.checkpoint_dropped(storage_id)

    def _save_single(self, storage_id: str, metadata: dict[str, Any], stage: Callable[[], None]) -> None:
        """Chief-only save: stage, commit (publish complete or not at all), record; abort on any failure."""
        try:
            stage()
            resources = self._storage.commit(storage_id, metadata)
        except BaseException:
            self._storage.abort(storage_id)
            self._dropped(storage_id)
            raise
        finally:
            self._storage.release(storage_id, 0)
        self._recorder.checkpoint_saved(storage_id, metadata, resources)

    def _save_sharded(self, storage_id: str, src: Path | None, plan: Outcome) -> None:
        """Collective save: agree on the plan, every rank stages its files, the chief commits."""
        metadata, staged, results = self._agree_and_stage(storage_id, src, plan)
        chief = self._dist.get_rank() == 0
        self._raise_for(staged, self._chief_commit(storage_id, metadata, results) if chief else None)

    def _agree_and_stage(self, storage_id: str, src: Path | None,
                         plan: Outcome) -> tuple[dict[str, Any], Outcome, list[Outcome]]:
        """Every rank: agree on the plans (any rank's failure drops the checkpoint everywhere), stage this
        rank's files; returns the merged metadata, this rank's staging outcome and (chief) every rank's."""
        rank = self._dist.get_rank()
        plans = self._dist.allgather(plan)
        try:
            if plan[0] is not None:
                raise plan[0]
            metadata = merge_plans(plans, storage_id)
        except BaseException:
            self._storage.release(storage_id, rank)
            if rank == 0:
                self._storage.abort(storage_id)
                self._dropped(storage_id)
            raise
        staged = attempt(lambda: self._put(storage_id, src, plan[1]["files"]))
        self._storage.release(storage_id, rank)
        return metadata, staged, self._dist.gather(staged) or []

    def _raise_for(self, staged: Outcome, chief_outcome: Outcome | None) -> None:
        """Every rank: the chief's outcome broadcast; raise this rank's staging error, else the chief's."""
        outcome = self._dist.broadcast(chief_outcome if self._dist.get_rank() == 0 else None)
        if staged[0] is not None:
            raise staged[0]
        if outcome[0] is not None:
            raise outcome[0]

    def _staging_failed(self, storage_id: str, results: list[Outcome]) -> Outcome:
        """Chief: drop the checkpoint when a rank failed to stage its files."""
        failed = [f"rank {r}: {exc}" for r, (exc, _) in enumerate(results) if exc is not None]
        if not failed:
            return (None, None)
        self._storage.abort(storage_id)
        self._dropped(storage_id)
        msg = f"checkpoint {storage_id} was not saved; ranks failed to stage their files: {'; '.join(failed)}"
        return (RuntimeError(msg), None)

    def _chief_commit(self, storage_id: str, metadata: dict[str, Any], results: list[Outcome]) -> Outcome:
        failed = self._staging_failed(storage_id, results)
        if failed[0] is not None:
            return failed
        committed = attempt(lambda: self._storage.commit(storage_id, metadata))
        if committed[0] is not None:
            self._storage.abort(storage_id)
            self._dropped(storage_id)
            return committed
        recorded = attempt(lambda: self._recorder.checkpoint_saved(storage_id, metadata, committed[1]))
        if recorded[0] is not None:
            return (RuntimeError(f"checkpoint {storage_id} was stored but recording it failed: {recorded[0]}"), None)
        return committed

    def _broadcast_id(self, metadata: Mapping[str, Any] | None) -> str:
        chief_id = None
        if self._dist.get_rank() == 0:
            chief_id = str(uuid.uuid4())
            try:  # the other ranks wait for the id: a failure here must not leave them hanging
                self._pending(chief_id, metadata if isinstance(metadata, Mapping) else None)
            except Exception as exc:  # noqa: BLE001 - the checkpoint is still recorded once complete
                logger.warning("could not record checkpoint %s as pending: %s", chief_id, exc)
        return str(self._dist.broadcast(chief_id))

    def _require_chief(self, method: str) -> None:
        rank = self._dist.get_rank()
        if rank != 0:
            raise RuntimeError(
                f"{method}(shard=False) may only be called by the chief (rank 0), but this is rank {rank}; "
                f"call it on rank 0 only, or call {method}(..., shard=True) on every rank"
            )

    # -- loading -----------------------------------------------------------------------------------
    def download(
        self,
        storage_id: str,
        ckpt_dir: str | os.PathLike[str],
        download_mode: DownloadMode | str = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Selector | None = None,
    ) -> None:
        """Copy the (selected) files of checkpoint ``storage_id`` into the local folder ``ckpt_dir``."""
        mode = DownloadMode(download_mode)
        if mode is DownloadMode.NoSharedDownload or self._dist.get_local_size() == 1:
            self._storage.download(storage_id, Path(ckpt_dir), selector)
            return
        self._shared_download(storage_id, Path(ckpt_dir), selector)

    @contextlib.contextmanager
    def restore_path(
        self,
        storage_id: str,
        download_mode: DownloadMode | str = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Selector | None = None,
    ) -> Iterator[Path]:
        """Yield a local folder holding checkpoint ``storage_id``.

        Directory storage yields the stored folder itself (no copy; do not modify it). Other
        storage downloads into a temporary folder that is removed when the block ends.
        """
        mode = DownloadMode(download_mode)
        local = self._storage.direct_access or mode is DownloadMode.NoSharedDownload
        if local or self._dist.get_local_size() == 1:
            with self._storage.restore(storage_id, selector) as path:
                yield path
            return
        chief = self._dist.get_local_rank() == 0
        tmp = Path(tempfile.mkdtemp(prefix=f"det-restore-{storage_id[:8]}-")) if chief else None
        try:
            yield self._shared_download(storage_id, tmp, selector)
        finally:
            self._dist.gather_local(None)  # the local chief removes the copy only once all are done
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def _shared_download(self, storage_id: str, dst: Path | None, selector: Selector | None) -> Path:
        """All local ranks call; local rank 0 downloads the union of what they select; return the folder."""
        chief = self._dist.get_local_rank() == 0
        listing = attempt(lambda: self._storage.list_files(storage_id)) if chief else None
        files = unwrap(self._dist.broadcast_local(listing))
        wanted = attempt(lambda: [f for f in files if selector is None or selector(f)])
        requests = self._dist.gather_local((None if dst is None else str(dst), wanted))
        result: Outcome | None = None
        if chief:
            assert dst is not None
            result = attempt(lambda: self._download_requests(storage_id, dst, requests or []))
        folder = unwrap(self._dist.broadcast_local(result))
        return dst if dst is not None else Path(folder)

    def _download_requests(self, storage_id: str, own: Path, requests: list[tuple[str | None, Outcome]]) -> str:
        by_dir: dict[str, set[str]] = {}
        for local_rank, (folder, wanted) in enumerate(requests):
            if wanted[0] is not None:
                raise RuntimeError(f"the selector of local rank {local_rank} failed: {wanted[0]}")
            by_dir.setdefault(folder or str(own), set()).update(wanted[1])
        for folder, files in by_dir.items():
            self._storage.download_files(storage_id, Path(folder), sorted(files))
        return str(own)

    # -- metadata and deletion ---------------------------------------------------------------------
    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        """The metadata stored with checkpoint ``storage_id`` (its ``metadata.json``)."""
        return self._storage.read_metadata(storage_id)

    def delete(self, storage_id: str) -> None:
        """Remove checkpoint ``storage_id`` (complete or partial) from storage and record the deletion."""
        if not self._storage.delete(storage_id):
            logger.warning("checkpoint %s was not found in %s; recording it as deleted", storage_id, self._storage)
        self._recorder.checkpoint_deleted(storage_id)
