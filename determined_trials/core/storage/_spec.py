"""storage_from_spec: turn a ``checkpoint_storage`` value (path, URI, dict, config object) into a backend."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from determined_trials.core.storage._azure import AzureStorage
from determined_trials.core.storage._base import StorageManager
from determined_trials.core.storage._directory import DirectoryStorage
from determined_trials.core.storage._gcs import GCSStorage
from determined_trials.core.storage._remote import RemoteStorage
from determined_trials.core.storage._s3 import S3Storage
from determined_trials.errors import ConfigError

__all__ = ["storage_from_spec"]

# Keys of Determined's checkpoint_storage that concern the checkpoint policy, not the backend.
_POLICY_KEYS = {"save_experiment_best", "save_trial_best", "save_trial_latest"}
_KEYS: dict[str, set[str]] = {
    "shared_fs": {"host_path", "storage_path", "propagation", "container_path"},
    "directory": {"container_path"},
    "s3": {"bucket", "prefix", "endpoint_url", "access_key", "secret_key", "region"},
    "gcs": {"bucket", "prefix", "endpoint_url"},
    "azure": {"container", "prefix", "connection_string", "account_url", "credential"},
}
_BUCKETS: dict[str, tuple[type[RemoteStorage], str]] = {
    "s3": (S3Storage, "bucket"), "gcs": (GCSStorage, "bucket"), "azure": (AzureStorage, "container"),
}
"""Bucket types: the backend and the key that names its bucket (the rest of _KEYS are its keyword arguments)."""
_URIS = "a directory path, file:///path, s3://<bucket>[/<prefix>], gs://<bucket>[/<prefix>] or az://<container>[/<prefix>]"
AZURE_CONNECTION_ENV = "AZURE_STORAGE_CONNECTION_STRING"


def storage_from_spec(spec: Any, *, default_dir: str | os.PathLike[str]) -> StorageManager:
    """Build the storage backend that ``spec`` describes.

    ``None`` -> a directory at ``default_dir``; a path -> that directory; ``s3://bucket/prefix`` -> S3,
    ``gs://bucket/prefix`` -> GCS, ``az://container/prefix`` -> Azure (the connection string from
    ``AZURE_STORAGE_CONNECTION_STRING``); a mapping (or a config object with ``model_dump()``) with ``type``
    shared_fs (host_path [+ storage_path]), directory (container_path), s3 (bucket, prefix, endpoint_url,
    access_key, secret_key, region), gcs (bucket, prefix, endpoint_url) or azure (container, prefix,
    connection_string | account_url + credential). A ready StorageManager is returned as is.
    """
    if spec is None:
        return DirectoryStorage(default_dir)
    if isinstance(spec, StorageManager):
        return spec
    if isinstance(spec, os.PathLike):
        return DirectoryStorage(spec)
    if isinstance(spec, str):
        return _from_string(spec)
    if hasattr(spec, "model_dump") and callable(spec.model_dump):
        spec = spec.model_dump()
    if isinstance(spec, Mapping):
        return _from_mapping(spec)
    raise ConfigError(
        f"checkpoint_storage must be {_URIS}, or a mapping with a 'type'; "
        f"got {type(spec).__name__}"
    )


def _from_string(spec: str) -> StorageManager:
    if not spec.strip():
        raise ConfigError(f"checkpoint_storage is an empty string; give {_URIS}")
    if "://" not in spec:
        return DirectoryStorage(spec)
    url = urlparse(spec)
    if url.scheme == "file":
        return DirectoryStorage(url.path)
    if url.scheme not in ("s3", "gs", "az"):
        raise ConfigError(f"checkpoint_storage URI scheme {url.scheme!r} is not supported ({spec!r}); use {_URIS}")
    if not url.netloc:
        what = "container" if url.scheme == "az" else "bucket"
        raise ConfigError(f"checkpoint_storage {spec!r} names no {what}; write {url.scheme}://<{what}>[/<prefix>]")
    prefix = url.path.strip("/")
    if url.scheme == "s3":
        return S3Storage(url.netloc, prefix)
    if url.scheme == "gs":
        return GCSStorage(url.netloc, prefix)
    connection_string = os.environ.get(AZURE_CONNECTION_ENV)
    if not connection_string:
        raise ConfigError(
            f"checkpoint_storage {spec!r} takes its connection string from {AZURE_CONNECTION_ENV}, which is not "
            "set; set it, or write checkpoint_storage as {type: azure, container: ..., connection_string: ...}"
        )
    return AzureStorage(url.netloc, prefix, connection_string=connection_string)


def _from_mapping(spec: Mapping[str, Any]) -> StorageManager:
    kind = spec.get("type")
    if kind not in _KEYS:
        known = ", ".join(sorted(_KEYS))
        hint = difflib.get_close_matches(str(kind), list(_KEYS), n=1)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"checkpoint_storage.type {kind!r} is not supported{suggestion}; use one of: {known}")
    values = {k: v for k, v in spec.items() if k != "type" and k not in _POLICY_KEYS}
    for key in values:
        if key not in _KEYS[kind]:
            hint = difflib.get_close_matches(key, sorted(_KEYS[kind]), n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(
                f"checkpoint_storage.{key} is not a field of type {kind!r}{suggestion} "
                f"(fields: {', '.join(sorted(_KEYS[kind]))})"
            )
    if kind in _BUCKETS:
        backend, name = _BUCKETS[kind]
        if not values.get(name):
            raise ConfigError(f"checkpoint_storage.{name} is required for type {kind!r}")
        options = {k: v for k, v in values.items() if k not in (name, "prefix")}  # the backends' keyword names
        return backend(values[name], values.get("prefix"), **options)
    if kind == "directory":
        return DirectoryStorage(_required_path(values, "container_path", kind))
    return DirectoryStorage(_shared_fs_path(values))


def _required_path(values: Mapping[str, Any], key: str, kind: str) -> Path:
    raw = values.get(key)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        raise ConfigError(f"checkpoint_storage.{key} is required for type {kind!r}")
    if not isinstance(raw, (str, os.PathLike)):
        raise ConfigError(f"checkpoint_storage.{key} must be a path string, got {type(raw).__name__}")
    return Path(raw).expanduser()


def _shared_fs_path(values: Mapping[str, Any]) -> Path:
    """host_path, or storage_path inside it (a relative storage_path is taken relative to host_path)."""
    host = _required_path(values, "host_path", "shared_fs")
    storage = values.get("storage_path")
    if storage is None or storage == "":
        return host
    path = Path(storage).expanduser()
    if not path.is_absolute():
        return host / path
    if not path.resolve().is_relative_to(host.resolve()):
        raise ConfigError(
            f"checkpoint_storage.storage_path {str(path)!r} lies outside host_path {str(host)!r}; "
            "make it relative to host_path or a folder inside it"
        )
    return path
