"""The StorageManager interface every checkpoint backend implements, its errors and shared file helpers."""

from __future__ import annotations

import abc
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "METADATA_FILE",
    "CheckpointNotFoundError",
    "Selector",
    "StorageError",
    "StorageManager",
    "check_storage_id",
    "dump_metadata",
    "list_local_files",
    "safe_join",
]

METADATA_FILE = "metadata.json"
"""Written last into every checkpoint: a checkpoint without it is incomplete and treated as absent."""

Selector = Callable[[str], bool]
"""Takes a path relative to the checkpoint root (``/``-separated) and says whether to include it."""


class StorageError(RuntimeError):
    """Checkpoint storage could not do what was asked (unreachable, misconfigured, refused)."""


class CheckpointNotFoundError(FileNotFoundError):
    """No complete checkpoint with this storage id exists in the storage."""

    def __init__(self, storage_id: str, where: str) -> None:
        super().__init__(
            f"checkpoint {storage_id!r} not found in {where}: it does not exist, was deleted, or is "
            f"incomplete (a checkpoint becomes visible only once complete, so one whose writer crashed "
            f"is invisible); check the storage id against the checkpoints listed for this run"
        )
        self.storage_id = storage_id
        self.where = where

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (type(self), (self.storage_id, self.where))


def check_storage_id(storage_id: str) -> str:
    """Return ``storage_id`` if it can name one checkpoint folder, else raise ValueError."""
    if not isinstance(storage_id, str) or not storage_id:
        raise ValueError(f"storage id must be a non-empty string (a checkpoint uuid), got {storage_id!r}")
    bad = "/" in storage_id or "\\" in storage_id or "\0" in storage_id or storage_id.startswith(".")
    if bad:
        raise ValueError(
            f"storage id {storage_id!r} is not a checkpoint uuid: it may not contain '/', '\\' or NUL "
            "nor start with '.'; pass the id returned by upload() or store_path()"
        )
    return storage_id


def list_local_files(root: Path, selector: Selector | None = None) -> dict[str, int]:
    """Files under ``root`` as {relative posix path: size in bytes}, filtered by ``selector``, sorted."""
    if not root.exists():
        raise FileNotFoundError(f"checkpoint directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"checkpoint directory {str(root)!r} is a file, not a directory")
    found: dict[str, int] = {}
    for rel, full in walk_local_tree(root, []):
        if selector is None or selector(rel):
            found[rel] = os.stat(full).st_size
    return found


def walk_local_tree(root: Path, folders: list[str]) -> Iterator[tuple[str, str]]:
    """(relative posix path, full path) of every file under ``root``, sorted as a walk; each folder's
    full path (``root`` first) is appended to ``folders`` as it is entered."""
    base = str(root)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        folders.append(dirpath)
        prefix = "" if dirpath == base else os.path.relpath(dirpath, base).replace(os.sep, "/") + "/"
        for name in sorted(filenames):
            yield prefix + name, os.path.join(dirpath, name)


def safe_join(root: Path, rel: str) -> Path:
    """``root / rel``, refusing a relative path that would land outside ``root``."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"refusing checkpoint file path {rel!r}: it is not a plain relative path")
    return root.joinpath(*parts)


def dump_metadata(metadata: dict[str, Any]) -> bytes:
    """Serialise checkpoint metadata as the bytes of ``metadata.json``."""
    return json.dumps(metadata, indent=2, sort_keys=True).encode("utf-8")


class StorageManager(abc.ABC):
    """Where checkpoints live: one folder (or key prefix) per storage id, ``metadata.json`` its mark of
    completeness.

    Writing is two-phase so that a checkpoint becomes visible only when complete: each rank stages its
    files (``stage_dir`` + ``put``), then the chief ``commit``s (merge, write metadata.json, publish)
    or ``abort``s. Reading never sees a checkpoint whose ``metadata.json`` is missing.
    """

    direct_access: bool = False
    """True when stored checkpoints are local folders that restore can hand out without copying."""

    stages_in_place: bool = False
    """True when the folder ``stage_dir`` returns is what ``commit`` publishes: files written there need
    no ``put`` (which would only remove the files it is not given)."""

    def local_folder(self) -> Path | None:
        """The local folder holding the checkpoints, for a storage with ``direct_access``; else None."""
        return None

    def remove_stale_staging(self, older_than_s: float = 24 * 3600.0) -> list[str]:
        """Delete the staging leftovers of crashed writers untouched for ``older_than_s`` and return their
        names; a storage that stages elsewhere (a temporary folder, then an upload) leaves none."""
        return []

    # -- writing -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def stage_dir(self, storage_id: str, rank: int) -> Path:
        """Create and return an empty local folder where ``rank`` writes its files for ``storage_id``."""

    @abc.abstractmethod
    def put(self, storage_id: str, rank: int, src: Path, files: Sequence[str]) -> None:
        """Stage ``files`` (paths relative to ``src``) as ``rank``'s part; nothing becomes visible."""

    @abc.abstractmethod
    def release(self, storage_id: str, rank: int) -> None:
        """Drop ``rank``'s local scratch space for ``storage_id`` (idempotent)."""

    @abc.abstractmethod
    def commit(self, storage_id: str, metadata: dict[str, Any]) -> dict[str, int]:
        """Chief only: merge the staged parts, write metadata.json, publish (metadata.json visible last);
        return resources."""

    @abc.abstractmethod
    def abort(self, storage_id: str) -> None:
        """Chief only: remove whatever was staged or partially written for ``storage_id``."""

    def check(self) -> None:
        """Raise StorageError (saying what to check) unless the storage can be used; before training.

        A directory is checked when it is made; a bucket on the network here (connect, bucket exists,
        credentials accepted).
        """
        return None

    # -- reading -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def exists(self, storage_id: str) -> bool:
        """True when a complete checkpoint ``storage_id`` is stored."""

    @abc.abstractmethod
    def list_checkpoints(self) -> list[str]:
        """Storage ids of all complete checkpoints, sorted."""

    @abc.abstractmethod
    def list_files(self, storage_id: str) -> dict[str, int]:
        """{relative path: size} of a complete checkpoint (CheckpointNotFoundError otherwise)."""

    @abc.abstractmethod
    def read_metadata(self, storage_id: str) -> dict[str, Any]:
        """The parsed ``metadata.json`` of a complete checkpoint."""

    @abc.abstractmethod
    def download(self, storage_id: str, dst: Path, selector: Selector | None = None) -> None:
        """Copy the (selected) files of a complete checkpoint into the local folder ``dst``."""

    @abc.abstractmethod
    def download_files(self, storage_id: str, dst: Path, files: Sequence[str]) -> None:
        """Copy exactly ``files`` (as returned by ``list_files``) into the local folder ``dst``."""

    @contextlib.contextmanager
    def restore(self, storage_id: str, selector: Selector | None = None) -> Iterator[Path]:
        """Yield a local folder holding the checkpoint; a temporary copy is removed afterwards."""
        tmp = Path(tempfile.mkdtemp(prefix=f"det-restore-{storage_id[:8]}-"))
        try:
            self.download(storage_id, tmp, selector)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @abc.abstractmethod
    def delete(self, storage_id: str) -> bool:
        """Remove everything stored under ``storage_id``, complete or not; False if nothing was there."""

    @abc.abstractmethod
    def describe(self) -> str:
        """A short human-readable location, e.g. ``directory /runs/checkpoints`` or ``s3://b/p``."""

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"
