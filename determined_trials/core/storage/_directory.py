"""DirectoryStorage: checkpoints as ``<dir>/<storage id>/`` folders, published by an atomic rename."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from determined_trials.core.storage._base import (
    METADATA_FILE,
    CheckpointNotFoundError,
    Selector,
    StorageError,
    StorageManager,
    check_storage_id,
    dump_metadata,
    list_local_files,
    safe_join,
    walk_local_tree,
)
from determined_trials.errors import ConfigError

__all__ = ["DirectoryStorage"]

_FSYNC_THREADS = 8  # concurrent fsyncs of one checkpoint's files (see _fsync_tree)
_SEQUENTIAL_FSYNCS = 1  # a lone file or folder is fsynced without the pool

logger = logging.getLogger("determined_trials.core")

_STAGING = ".staging-"
_DELETING = ".deleting-"
_MERGED = "merged"


class DirectoryStorage(StorageManager):
    """Checkpoints in a local or shared folder (``shared_fs``/``directory`` configs, plain paths).

    Each rank writes into ``<dir>/.staging-<id>/rank-<r>/``; the chief merges the rank folders,
    writes ``metadata.json`` and renames the result to ``<dir>/<id>``, so a checkpoint appears
    complete or not at all (also when the writer is killed). Hidden entries are never listed.
    Direct access: ``restore`` yields the stored folder itself, without copying. With several
    machines the folder must be on a file system that all of them share.
    """

    direct_access = True
    stages_in_place = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        root = Path(path).expanduser()
        if root.exists() and not root.is_dir():
            raise ConfigError(
                f"checkpoint storage path {str(root)!r} is a file; give a directory (it is created if missing)"
            )
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create checkpoint storage directory {str(root)!r}: {exc}") from exc
        self._root = root.resolve()

    @property
    def path(self) -> Path:
        """The folder that holds one sub-folder per checkpoint."""
        return self._root

    def describe(self) -> str:
        return f"directory {self._root}"

    # -- writing -----------------------------------------------------------------------------------
    def _staging(self, storage_id: str) -> Path:
        return self._root / f"{_STAGING}{check_storage_id(storage_id)}"

    def stage_dir(self, storage_id: str, rank: int) -> Path:
        staging = self._staging(storage_id)
        path = staging / f"rank-{int(rank)}"
        for folder in (staging, path):  # two mkdirs: cheaper than pathlib's parents=True retry on a fresh id
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder)
        return path

    def put(self, storage_id: str, rank: int, src: Path, files: Sequence[str]) -> None:
        dest = self.stage_dir(storage_id, rank)
        if Path(src).resolve() == dest.resolve():
            keep = set(files)
            for rel in list_local_files(dest):
                if rel not in keep:
                    safe_join(dest, rel).unlink()
            return
        for rel in files:
            target = safe_join(dest, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(safe_join(Path(src), rel), target)

    def release(self, storage_id: str, rank: int) -> None:
        """Nothing to drop: staged files live in the storage folder until commit or abort."""

    def commit(self, storage_id: str, metadata: dict[str, Any]) -> dict[str, int]:
        staging = self._staging(storage_id)
        final = self._root / storage_id
        ranks = _rank_dirs(staging)
        if not ranks:  # a checkpoint holding only its metadata
            ranks = [self.stage_dir(storage_id, 0)]
        if final.exists():
            raise StorageError(f"checkpoint {storage_id!r} already exists in {self._root}; ids must be fresh")
        ready = ranks[0] if len(ranks) == 1 else _merge(ranks, staging / _MERGED)
        # The rename publishes: metadata.json goes in with the other files, and every file and folder
        # (metadata.json included) is on disk before the checkpoint can be listed.
        (ready / METADATA_FILE).write_bytes(dump_metadata(metadata))
        resources = _fsync_tree(ready)
        os.rename(ready, final)
        _fsync_dir(self._root)
        try:
            os.rmdir(staging)  # empty once its only rank folder was published
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
        return resources

    def abort(self, storage_id: str) -> None:
        shutil.rmtree(self._staging(storage_id), ignore_errors=True)

    def local_folder(self) -> Path:
        return self.path

    def remove_stale_staging(self, older_than_s: float = 24 * 3600.0) -> list[str]:
        """Delete staging/deleting leftovers of crashed writers untouched for ``older_than_s``; return names."""
        removed = []
        cutoff = time.time() - older_than_s
        for entry in self._root.iterdir():
            if entry.name.startswith((_STAGING, _DELETING)) and _newest_mtime(entry) < cutoff:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
        return sorted(removed)

    # -- reading -----------------------------------------------------------------------------------
    def _require(self, storage_id: str) -> Path:
        path = self._root / check_storage_id(storage_id)
        if not (path / METADATA_FILE).is_file():
            raise CheckpointNotFoundError(storage_id, self.describe())
        return path

    def exists(self, storage_id: str) -> bool:
        return (self._root / check_storage_id(storage_id) / METADATA_FILE).is_file()

    def list_checkpoints(self) -> list[str]:
        return sorted(
            e.name for e in self._root.iterdir() if not e.name.startswith(".") and (e / METADATA_FILE).is_file()
        )

    def list_files(self, storage_id: str) -> dict[str, int]:
        return list_local_files(self._require(storage_id))

    def read_metadata(self, storage_id: str) -> dict[str, Any]:
        path = self._require(storage_id) / METADATA_FILE
        data = json.loads(path.read_bytes())
        if not isinstance(data, dict):
            raise StorageError(f"{path} does not hold a JSON object; the checkpoint is damaged")
        return data

    def download(self, storage_id: str, dst: Path, selector: Selector | None = None) -> None:
        self.download_files(storage_id, dst, list(list_local_files(self._require(storage_id), selector)))

    def download_files(self, storage_id: str, dst: Path, files: Sequence[str]) -> None:
        src = self._require(storage_id)
        Path(dst).mkdir(parents=True, exist_ok=True)
        for rel in files:
            target = safe_join(Path(dst), rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(safe_join(src, rel), target)

    @contextlib.contextmanager
    def restore(self, storage_id: str, selector: Selector | None = None) -> Iterator[Path]:
        """Yield the stored folder itself (direct access); ``selector`` is moot since nothing is copied."""
        path = self._require(storage_id)
        if selector is not None:
            logger.debug("restore of %s from %s yields the stored folder; selector not applied", storage_id, self)
        yield path

    def delete(self, storage_id: str) -> bool:
        path = self._root / check_storage_id(storage_id)
        staging = self._staging(storage_id)
        found = path.exists() or staging.exists()
        if path.exists():
            # Rename first so that readers never see a half-deleted checkpoint as a valid one.
            trash = self._root / f"{_DELETING}{storage_id}-{uuid.uuid4().hex[:8]}"
            os.rename(path, trash)
            shutil.rmtree(trash, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
        return found


def _merge(rank_dirs: list[Path], target: Path) -> Path:
    """Move every file of ``rank_dirs`` into ``target`` (same file system); a clash is an error."""
    target.mkdir(parents=True, exist_ok=True)
    for rank_dir in rank_dirs:
        for rel in list_local_files(rank_dir):
            if rel == METADATA_FILE:
                continue  # replaced by the checkpoint's own metadata.json
            dest = safe_join(target, rel)
            if dest.exists():
                raise StorageError(f"file {rel!r} was written by more than one rank ({rank_dir.name} and another)")
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(safe_join(rank_dir, rel), dest)
    return target


def _rank_dirs(staging: Path) -> list[Path]:
    """The ``rank-<r>`` folders of a staging folder, by rank."""
    try:
        names = os.listdir(staging)
    except FileNotFoundError:
        return []
    ranks = sorted(int(name[5:]) for name in names if name.startswith("rank-"))
    return [staging / f"rank-{rank}" for rank in ranks]


def _fsync_tree(root: Path) -> dict[str, int]:
    """fsync every file and folder under ``root`` (their data and entries) before returning; return
    its files as ``list_local_files`` does ({relative posix path: size}, sorted as a walk).

    On the main thread (someone waits: the training loop) the fsyncs run concurrently (a few
    threads): the filesystem then commits them together, which takes less time than one after the
    other (about a third on ext4 under load). On another thread (a background writer nobody waits
    for) they run one after the other, so that fewer threads compete with training for the cores.
    All are done before the caller publishes (the rename), so a listed checkpoint never has a file
    that is not on disk.
    """
    files: dict[str, int] = {}
    paths: list[str] = []
    folders: list[str] = []
    for rel, path in walk_local_tree(root, folders):
        files[rel] = os.stat(path).st_size
        paths.append(path)
    if len(paths) + len(folders) <= _SEQUENTIAL_FSYNCS or threading.current_thread() is not threading.main_thread():
        for path in paths:
            _fsync_file(path)
        for folder in folders:
            _fsync_dir(Path(folder))
        return files
    pool = _fsync_pool()
    done = [pool.submit(_fsync_file, path) for path in paths]
    done += [pool.submit(_fsync_dir, Path(folder)) for folder in folders]
    for future in done:
        future.result()  # an error fsyncing a file is raised here, as before
    return files


_POOL: dict[int, concurrent.futures.ThreadPoolExecutor] = {}  # pid -> the pool whose threads every commit reuses


def _fsync_pool() -> concurrent.futures.ThreadPoolExecutor:
    pool = _POOL.get(os.getpid())  # a forked child starts its own (its parent's threads are not in it)
    if pool is None:
        _POOL.clear()
        pool = _POOL[os.getpid()] = concurrent.futures.ThreadPoolExecutor(
            max_workers=_FSYNC_THREADS, thread_name_prefix="det-fsync")
    return pool


def _fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """A folder's fsync (its entries durable), where the file system allows one."""
    with contextlib.suppress(OSError):
        _fsync_file(path)


def _newest_mtime(path: Path) -> float:
    newest = path.stat().st_mtime
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(os.path.join(dirpath, name)).st_mtime)
    return newest
