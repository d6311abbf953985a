"""storage_from_spec: the backend for a ``checkpoint_storage`` value, from the section ``config.parse_storage``
makes of it (every rule about the value lives there)."""

from __future__ import annotations

import os
from typing import Any

from determined_trials.config import AzureStorage as AzureSection
from determined_trials.config import GCSStorage as GCSSection
from determined_trials.config import S3Storage as S3Section
from determined_trials.config import parse_storage
from determined_trials.core.storage._azure import AzureStorage
from determined_trials.core.storage._base import StorageManager
from determined_trials.core.storage._directory import DirectoryStorage
from determined_trials.core.storage._gcs import GCSStorage
from determined_trials.core.storage._s3 import S3Storage

__all__ = ["storage_from_spec"]


def storage_from_spec(spec: Any, *, default_dir: str | os.PathLike[str]) -> StorageManager:
    """Build the storage backend that ``spec`` describes.

    ``None`` -> a directory at ``default_dir``; a ready StorageManager is returned as is; anything else is
    what ``config.parse_storage`` takes (a path, a ``file://``, ``s3://``, ``gs://`` or ``az://`` URI, a
    mapping with ``type``, a parsed section): shared_fs and directory sections are a directory, s3, gcs and
    azure ones the bucket backend of that name. A ``ConfigError`` says what is wrong and how to fix it.
    """
    if isinstance(spec, StorageManager):
        return spec
    section = parse_storage(spec)
    if section is None:
        return DirectoryStorage(default_dir)
    if isinstance(section, S3Section):
        return S3Storage(section)
    if isinstance(section, GCSSection):
        return GCSStorage(section)
    if isinstance(section, AzureSection):
        return AzureStorage(section)
    return DirectoryStorage(section.directory)
