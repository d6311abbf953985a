"""Checkpoint storage backends (a directory, S3, GCS, Azure Blob) behind one StorageManager interface, each
built from the section ``config.parse_storage`` makes of a ``checkpoint_storage`` value.

May import: errors, config
"""

from __future__ import annotations

from determined_trials.core.storage._azure import AzureStorage
from determined_trials.core.storage._base import (
    METADATA_FILE,
    CheckpointNotFoundError,
    Selector,
    StorageError,
    StorageManager,
    list_local_files,
)
from determined_trials.core.storage._directory import DirectoryStorage
from determined_trials.core.storage._gcs import GCSStorage
from determined_trials.core.storage._remote import RemoteStorage
from determined_trials.core.storage._s3 import S3Storage
from determined_trials.core.storage._spec import storage_from_spec

__all__ = [
    "METADATA_FILE",
    "AzureStorage",
    "CheckpointNotFoundError",
    "DirectoryStorage",
    "GCSStorage",
    "RemoteStorage",
    "S3Storage",
    "Selector",
    "StorageError",
    "StorageManager",
    "storage_from_spec",
    "list_local_files",
]
