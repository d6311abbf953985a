"""CheckpointContext: save (upload, store_path) and load (download, restore_path) checkpoints, sharded or not."""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import pickle
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from determined_trials.core._staged import StagedCheckpoint, StagedShard
from determined_trials.core.storage import METADATA_FILE, Selector, StorageManager
from determined_trials.core.storage._base import list_local_files

if TYPE_CHECKING:
    from determined_trials.core._distributed import DistributedContext

__all__ = ["CheckpointContext", "CheckpointRecorder", "DownloadMode"]

logger = logging.getLogger("determined_trials.core")

_T = TypeVar("_T")
# What ranks exchange about a step: (the exception that stopped it, or None; its result).
_Outcome = tuple[BaseException | None, Any]


class DownloadMode(enum.Enum):
    """Who downloads in ``download``/``restore_path`` when several ranks share a machine."""

    LocalWorkersShareDownload = "LocalWorkersShareDownload"
    """All ranks call; only local rank 0 of each machine downloads, the others use its copy."""
    NoSharedDownload = "NoSharedDownload"
    """Every rank downloads for itself (and need not call in step with the others)."""


class CheckpointRecorder(Protocol):
    """Told about saved and deleted checkpoints (the local store implements it).

    Optionally also ``checkpoint_pending(storage_id, metadata)`` (before anything is staged) and
    ``checkpoint_dropped(storage_id)`` (the save failed): a pending checkpoint whose writer died is
    settled at the next start (``recover_checkpoints``), published or not.
    """

    def checkpoint_saved(self, storage_id: str, metadata: dict[str, Any], resources: dict[str, int]) -> None: ...

    def checkpoint_deleted(self, storage_id: str) -> None: ...


class _LoggingRecorder:
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
            md = _check_metadata(metadata)
            files = _checkpoint_files(src, selector)
            storage_id = str(uuid.uuid4())
            self._pending(storage_id, md)
            self._save_single(storage_id, md, lambda: self._put(storage_id, src, files))
            return storage_id
        storage_id = self._broadcast_id(metadata)
        plan = _attempt(lambda: {"files": _checkpoint_files(src, selector), "metadata": _jsonable(metadata)})
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
                self._save_sharded(storage_id, path, (_portable(exc), None))
            raise
        except BaseException:
            self._storage.release(storage_id, rank)
            raise
        plan = _attempt(lambda: {"files": _checkpoint_files(path, None), "metadata": _jsonable(metadata)})
        self._save_sharded(storage_id, path, plan)

    def stage_shard(self, metadata: dict[str, Any] | None = None) -> StagedShard:
        """Every rank: ``store_path(shard=True)`` in steps, so that the ranks' files may be written, and
        the checkpoint committed, in the background: write into the returned ``path``, then ``collect()``
        (a collective) and run the chief's commit anywhere, or ``abort()`` (a collective)."""
        storage_id = self._broadcast_id(metadata)
        rank = self._dist.get_rank()
        path = self._storage.stage_dir(storage_id, rank)

        def collect() -> Callable[[], str] | None:
            plan = _attempt(lambda: {"files": _checkpoint_files(path, None), "metadata": _jsonable(metadata)})
            return self._collect_sharded(storage_id, path, plan)

        def abort() -> None:
            reason = RuntimeError(f"checkpoint {storage_id} was not saved: rank {rank} gave up on its shard")
            self._save_sharded(storage_id, path, (reason, None))

        return StagedShard(path, storage_id, collect, abort)

    def _collect_sharded(self, storage_id: str, src: Path, plan: _Outcome) -> Callable[[], str] | None:
        """``_save_sharded`` up to the chief's commit, which it returns (None on the other ranks)."""
        metadata, staged, results = self._agree_and_stage(storage_id, src, plan)
        chief = self._dist.get_rank() == 0
        self._raise_for(staged, self._staging_failed(storage_id, results) if chief else None)
        if not chief:
            return None

        def commit() -> str:
            committed = _attempt(lambda: self._storage.commit(storage_id, metadata))
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
        md = _check_metadata(metadata)
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
            self._put(storage_id, path, _checkpoint_files(path, None))
        elif (path / METADATA_FILE).exists():
            _warn_metadata_replaced(path)

    def _put(self, storage_id: str, src: Path | None, files: dict[str, int]) -> None:
        if src is not None and files:
            self._storage.put(storage_id, self._dist.get_rank(), src, list(files))

    def _pending(self, storage_id: str, metadata: Mapping[str, Any] | None) -> None:
        """Record the checkpoint as pending before anything is staged (chief), so a crash can be settled."""
        pending = getattr(self._recorder, "checkpoint_pending", None)
        if pending is not None:
            pending(storage_id, _jsonable(metadata))

    def _dropped(self, storage_id: str) -> None:
        dropped = getattr(self._recorder, "checkpoint_dropped", None)
        if dropped is not None:
            dropped(storage_id)

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

    def _save_sharded(self, storage_id: str, src: Path | None, plan: _Outcome) -> None:
        """Collective save: agree on the plan, every rank stages its files, the chief commits."""
        metadata, staged, results = self._agree_and_stage(storage_id, src, plan)
        chief = self._dist.get_rank() == 0
        self._raise_for(staged, self._chief_commit(storage_id, metadata, results) if chief else None)

    def _agree_and_stage(self, storage_id: str, src: Path | None,
                         plan: _Outcome) -> tuple[dict[str, Any], _Outcome, list[_Outcome]]:
        """Every rank: agree on the plans (any rank's failure drops the checkpoint everywhere), stage this
        rank's files; returns the merged metadata, this rank's staging outcome and (chief) every rank's."""
        rank = self._dist.get_rank()
        plans = self._dist.allgather(plan)
        try:
            if plan[0] is not None:
                raise plan[0]
            metadata = _merge_plans(plans, storage_id)
        except BaseException:
            self._storage.release(storage_id, rank)
            if rank == 0:
                self._storage.abort(storage_id)
                self._dropped(storage_id)
            raise
        staged = _attempt(lambda: self._put(storage_id, src, plan[1]["files"]))
        self._storage.release(storage_id, rank)
        return metadata, staged, self._dist.gather(staged) or []

    def _raise_for(self, staged: _Outcome, chief_outcome: _Outcome | None) -> None:
        """Every rank: the chief's outcome broadcast; raise this rank's staging error, else the chief's."""
        outcome = self._dist.broadcast(chief_outcome if self._dist.get_rank() == 0 else None)
        if staged[0] is not None:
            raise staged[0]
        if outcome[0] is not None:
            raise outcome[0]

    def _staging_failed(self, storage_id: str, results: list[_Outcome]) -> _Outcome:
        """Chief: drop the checkpoint when a rank failed to stage its files."""
        failed = [f"rank {r}: {exc}" for r, (exc, _) in enumerate(results) if exc is not None]
        if not failed:
            return (None, None)
        self._storage.abort(storage_id)
        self._dropped(storage_id)
        msg = f"checkpoint {storage_id} was not saved; ranks failed to stage their files: {'; '.join(failed)}"
        return (RuntimeError(msg), None)

    def _chief_commit(self, storage_id: str, metadata: dict[str, Any], results: list[_Outcome]) -> _Outcome:
        failed = self._staging_failed(storage_id, results)
        if failed[0] is not None:
            return failed
        committed = _attempt(lambda: self._storage.commit(storage_id, metadata))
        if committed[0] is not None:
            self._storage.abort(storage_id)
            self._dropped(storage_id)
            return committed
        recorded = _attempt(lambda: self._recorder.checkpoint_saved(storage_id, metadata, committed[1]))
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
        listing = _attempt(lambda: self._storage.list_files(storage_id)) if chief else None
        files = _unwrap(self._dist.broadcast_local(listing))
        wanted = _attempt(lambda: [f for f in files if selector is None or selector(f)])
        requests = self._dist.gather_local((None if dst is None else str(dst), wanted))
        result: _Outcome | None = None
        if chief:
            assert dst is not None
            result = _attempt(lambda: self._download_requests(storage_id, dst, requests or []))
        folder = _unwrap(self._dist.broadcast_local(result))
        return dst if dst is not None else Path(folder)

    def _download_requests(self, storage_id: str, own: Path, requests: list[tuple[str | None, _Outcome]]) -> str:
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


# -- helpers -----------------------------------------------------------------------------------------
def _checkpoint_files(src: Path | None, selector: Selector | None) -> dict[str, int]:
    """The files to store from ``src`` ({relative path: size}); a top-level metadata.json is replaced."""
    if src is None:
        return {}
    files = list_local_files(src, selector)
    if files.pop(METADATA_FILE, None) is not None:
        _warn_metadata_replaced(src)
    return files


def _warn_metadata_replaced(folder: Path) -> None:
    logger.warning("%s in %s is replaced by the checkpoint's own metadata", METADATA_FILE, folder)


def _check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validated, JSON-normalised checkpoint metadata; it must hold ``steps_completed``."""
    fix = "pass metadata={'steps_completed': <batches trained so far>, ...}"
    if metadata is None:
        raise ValueError(f"checkpoint metadata is required and must include 'steps_completed'; {fix}")
    if not isinstance(metadata, Mapping):
        raise TypeError(f"checkpoint metadata must be a dict, got {type(metadata).__name__}; {fix}")
    if "steps_completed" not in metadata:
        raise ValueError(f"checkpoint metadata has no 'steps_completed' (keys: {sorted(metadata)}); {fix}")
    md = _jsonable(metadata)
    steps = md["steps_completed"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"metadata['steps_completed'] must be an integer >= 0, got {steps!r}")
    return md


def _jsonable(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """A JSON round trip of ``metadata`` (numpy/tensor scalars converted); ValueError if impossible."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"checkpoint metadata must be a dict, got {type(metadata).__name__}")
    try:
        result: dict[str, Any] = json.loads(json.dumps(dict(metadata), default=_json_default))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"checkpoint metadata must be JSON-serialisable: {exc}") from exc
    return result


def _json_default(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    raise TypeError(f"a value of type {type(value).__name__} is not JSON-serialisable ({value!r:.80})")


def _merge_plans(plans: list[_Outcome], storage_id: str) -> dict[str, Any]:
    """Check the ranks' plans (failures, clashing files) and merge their metadata (same on every rank)."""
    failed = [f"rank {r}: {exc}" for r, (exc, _) in enumerate(plans) if exc is not None]
    if failed:
        raise RuntimeError(f"checkpoint {storage_id} was not saved because {'; '.join(failed)}")
    owners: dict[str, list[int]] = {}
    for rank, (_, plan) in enumerate(plans):
        for rel in plan["files"]:
            owners.setdefault(rel, []).append(rank)
    clashes = [f"{rel!r} (ranks {', '.join(map(str, ranks))})" for rel, ranks in owners.items() if len(ranks) > 1]
    if clashes:
        more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
        raise RuntimeError(
            f"shard=True checkpoint {storage_id}: the same file was written by several ranks: "
            f"{', '.join(clashes[:5])}{more}; each file must come from exactly one rank (use rank-specific "
            "names, or let only one rank write shared files)"
        )
    merged: dict[str, Any] = {}
    sources: dict[str, int] = {}
    for rank, (_, plan) in enumerate(plans):
        _merge_metadata(merged, plan["metadata"], rank, sources, "")
    return _check_metadata(merged)


def _merge_metadata(into: dict[str, Any], new: dict[str, Any], rank: int, sources: dict[str, int], path: str) -> None:
    for key, value in new.items():
        name = f"{path}{key}"
        if key not in into:
            into[key] = value
            sources[name] = rank
        elif isinstance(into[key], dict) and isinstance(value, dict):
            _merge_metadata(into[key], value, rank, sources, f"{name}.")
        elif into[key] != value:
            raise ValueError(
                f"checkpoint metadata key {name!r} differs between ranks: rank {sources.get(name, '?')} gave "
                f"{into[key]!r}, rank {rank} gave {value!r}; give the same value everywhere or set it on one rank"
            )


def _attempt(fn: Callable[[], _T]) -> _Outcome:
    """Run ``fn``; any failure is captured (not raised) so that it can be sent to the other ranks."""
    try:
        return (None, fn())
    except Exception as exc:  # noqa: BLE001 - forwarded to every rank and raised there
        return (_portable(exc), None)


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (to travel to other ranks), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any pickling failure means "send the text instead"
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _unwrap(outcome: _Outcome | None) -> Any:
    assert outcome is not None
    if outcome[0] is not None:
        raise outcome[0]
    return outcome[1]
