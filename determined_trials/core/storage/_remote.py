"""RemoteStorage: what the object-store backends (S3, GCS, Azure) share: checkpoints under
``<prefix>/<storage id>/``, each rank uploading its own files, metadata.json uploaded last as the mark of
completeness, listing, downloads into local folders, and deletes that drop metadata.json first.

A backend supplies a client, a start-up check of its bucket, a translation of its client's errors, and a
handful of object operations (upload a file or bytes, read, list under a prefix, download, delete keys).
"""

from __future__ import annotations

import abc
import contextlib
import importlib.util
import json
import logging
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from determined_trials.core.storage import _base
from determined_trials.core.storage._base import METADATA_FILE, CheckpointNotFoundError, StorageError, StorageManager
from determined_trials.errors import ConfigError

__all__ = ["RemoteStorage", "quiet_loggers", "require_package"]


def require_package(module: str, extra: str, what: str) -> None:
    """Raise StorageError naming the pip extra unless ``module`` can be imported (nothing is imported)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package
        found = False
    if not found:
        raise StorageError(
            f"{what} checkpoint storage needs the {module} package: pip install 'determined-trials[{extra}]'"
        )


def quiet_loggers(names: Sequence[str]) -> None:
    """Set each named logger whose level nobody set to WARNING: a client library's per-request INFO lines
    (azure-core logs every request's headers) stay out of the trial log; a level the user chose is kept."""
    for name in names:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


class RemoteStorage(StorageManager):
    """Checkpoints as objects ``<prefix>/<storage id>/<file>`` in one bucket (or container).

    Every rank uploads its own files from a temporary scratch folder; after all ranks are done the chief
    uploads ``metadata.json``. A prefix without ``metadata.json`` (a writer that crashed mid-upload) is
    treated as absent: not listed, not restorable, but removable by ``delete``. The client is made and the
    bucket checked once, at ``check()`` or the first operation, whichever comes first.
    """

    direct_access = False
    scheme = ""
    """The URI scheme of ``describe()``: ``s3``, ``gs`` or ``az``."""
    service = ""
    """The service's name in messages: ``S3``, ``GCS``, ``Azure``."""
    name_pattern: re.Pattern[str] = re.compile(".+")
    name_rule = ""
    """What a valid bucket (container) name is, for the error when ``name_pattern`` does not match."""
    name_key = "bucket"
    """The config key that names the bucket (``container`` for Azure)."""
    client_loggers: tuple[str, ...] = ()
    """The client library's loggers, quieted (``quiet_loggers``) when the client is made."""

    def __init__(self, bucket: str, prefix: str | None) -> None:
        if not isinstance(bucket, str) or not self.name_pattern.match(bucket):
            raise ConfigError(
                f"invalid {self.service} {self.name_key} name {bucket!r}: use {self.name_rule} "
                f"(checkpoint_storage.{self.name_key})"
            )
        self.bucket = bucket
        self.prefix = (prefix or "").strip("/")
        self._client_obj: Any = None
        self._client_lock = threading.Lock()
        self._scratch: dict[tuple[str, int], Path] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (e.g. sent to another process): without the client and its lock, made again there."""
        return {**self.__dict__, "_client_obj": None, "_client_lock": None, "_scratch": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _client_lock=threading.Lock())

    def describe(self) -> str:
        where = f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")
        endpoint = self._endpoint()
        return f"{where} (endpoint {endpoint})" if endpoint else where

    def check(self) -> None:
        """Make the client and check the bucket: a StorageError saying what to fix if it is not usable."""
        _ = self._client

    # -- what a backend supplies ----------------------------------------------------------------------
    def _endpoint(self) -> str | None:
        """A non-default endpoint to name in ``describe()`` (an emulator, a private endpoint), else None."""
        return None

    @abc.abstractmethod
    def _make_client(self) -> Any:
        """The client library's object for this bucket (imported lazily)."""

    @abc.abstractmethod
    def _check_bucket(self, client: Any) -> None:
        """Raise (inside ``_errors``) unless the bucket exists and these credentials may use it."""

    @abc.abstractmethod
    def _errors(self, action: str) -> contextlib.AbstractContextManager[None]:
        """Turn the client's failures during ``action`` into StorageErrors that say what to check."""

    @abc.abstractmethod
    def _upload_file(self, key: str, path: str) -> None: ...

    @abc.abstractmethod
    def _upload_bytes(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def _read_bytes(self, key: str) -> bytes | None:
        """The object's content, or None if there is no such object."""

    @abc.abstractmethod
    def _list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object whose key starts with ``prefix``."""

    @abc.abstractmethod
    def _download_file(self, key: str, path: str) -> None: ...

    @abc.abstractmethod
    def _delete_keys(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` (all existing when listed; one that vanished since is no error)."""

    # -- plumbing ------------------------------------------------------------------------------------
    @property
    def _client(self) -> Any:
        if self._client_obj is None:
            with self._client_lock:  # the training thread and a background writer may both get here
                if self._client_obj is None:
                    quiet_loggers(self.client_loggers)
                    with self._errors("connecting"):
                        client = self._make_client()
                    with self._errors("checking the bucket"):
                        self._check_bucket(client)
                    self._client_obj = client
        return self._client_obj

    def _key(self, storage_id: str, rel: str = "") -> str:
        folder = f"{_base.check_storage_id(storage_id)}/"
        base = f"{self.prefix}/{folder}" if self.prefix else folder
        return base + rel

    def _iter_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        self.check()
        with self._errors(f"listing {prefix!r}"):
            yield from self._list(prefix)

    # -- writing -------------------------------------------------------------------------------------
    def stage_dir(self, storage_id: str, rank: int) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"det-ckpt-{_base.check_storage_id(storage_id)[:8]}-r{int(rank)}-"))
        self._scratch[(storage_id, int(rank))] = path
        return path

    def put(self, storage_id: str, rank: int, src: Path, files: Sequence[str]) -> None:
        self.check()
        for rel in files:
            if rel == METADATA_FILE:
                raise StorageError(f"{METADATA_FILE} is written by commit(), not put(); leave it out")
            with self._errors(f"uploading {rel!r}"):
                self._upload_file(self._key(storage_id, rel), str(_base.safe_join(Path(src), rel)))

    def release(self, storage_id: str, rank: int) -> None:
        path = self._scratch.pop((storage_id, int(rank)), None)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)

    def commit(self, storage_id: str, metadata: dict[str, Any]) -> dict[str, int]:
        self.check()
        with self._errors(f"uploading {METADATA_FILE}"):
            self._upload_bytes(self._key(storage_id, METADATA_FILE), _base.dump_metadata(metadata))
        return self.list_files(storage_id)

    def abort(self, storage_id: str) -> None:
        for key in [k for k in self._scratch if k[0] == storage_id]:
            self.release(*key)
        with contextlib.suppress(StorageError):
            self.delete(storage_id)

    # -- reading -------------------------------------------------------------------------------------
    def _metadata_bytes(self, storage_id: str) -> bytes | None:
        self.check()
        with self._errors(f"reading {METADATA_FILE}"):
            return self._read_bytes(self._key(storage_id, METADATA_FILE))

    def exists(self, storage_id: str) -> bool:
        return self._metadata_bytes(storage_id) is not None

    def list_checkpoints(self) -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        found = set()
        for key, _size in self._iter_objects(base):
            parts = key[len(base) :].split("/")
            if len(parts) == 2 and parts[1] == METADATA_FILE and not parts[0].startswith("."):
                found.add(parts[0])
        return sorted(found)

    def list_files(self, storage_id: str) -> dict[str, int]:
        if not self.exists(storage_id):
            raise CheckpointNotFoundError(storage_id, self.describe())
        base = self._key(storage_id)
        return dict(sorted((key[len(base) :], int(size)) for key, size in self._iter_objects(base)))

    def read_metadata(self, storage_id: str) -> dict[str, Any]:
        raw = self._metadata_bytes(storage_id)
        if raw is None:
            raise CheckpointNotFoundError(storage_id, self.describe())
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise StorageError(f"{METADATA_FILE} of {storage_id!r} in {self.describe()} is not a JSON object")
        return data

    def download(self, storage_id: str, dst: Path, selector: _base.Selector | None = None) -> None:
        files = [f for f in self.list_files(storage_id) if selector is None or selector(f)]
        self.download_files(storage_id, dst, files)

    def download_files(self, storage_id: str, dst: Path, files: Sequence[str]) -> None:
        self.check()
        Path(dst).mkdir(parents=True, exist_ok=True)
        for rel in files:
            target = _base.safe_join(Path(dst), rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            with self._errors(f"downloading {rel!r}"):
                self._download_file(self._key(storage_id, rel), str(target))

    def delete(self, storage_id: str) -> bool:
        keys = [key for key, _size in self._iter_objects(self._key(storage_id))]
        if not keys:
            return False
        meta = self._key(storage_id, METADATA_FILE)
        with self._errors(f"deleting {storage_id!r}"):
            if meta in keys:  # first: from then on readers treat the rest as absent
                self._delete_keys([meta])
            rest = [k for k in keys if k != meta]
            if rest:
                self._delete_keys(rest)
        return True
