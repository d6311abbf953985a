"""The `checkpoint_storage` section: a path/URI string or a mapping chosen by `type`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from determined_trials.config._base import StrictModel, tagged_union
from determined_trials.config._det_keys import drop_unused_keys

__all__ = ["AzureStorage", "DirectoryStorage", "GCSStorage", "S3Storage", "SharedFSStorage", "StorageConfig"]


class _StorageBase(StrictModel):
    """Checkpoint retention counts (kept for ported configs; the runner may apply them)."""

    type: str = Field(description="the storage type: shared_fs, directory, s3, gcs or azure")
    save_experiment_best: int = Field(default=0, ge=0, description="best checkpoints kept per experiment")
    save_trial_best: int = Field(default=1, ge=0, description="best checkpoints kept per trial")
    save_trial_latest: int = Field(default=1, ge=0, description="latest checkpoints kept per trial")

    @model_validator(mode="before")
    @classmethod
    def _cluster_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        return drop_unused_keys(data, f"checkpoint_storage.{kind}", cls.model_fields, "checkpoint_storage ")


class SharedFSStorage(_StorageBase):
    """A directory on a shared file system: `host_path` [/ `storage_path`]."""

    type: Literal["shared_fs"] = "shared_fs"
    host_path: str = Field(min_length=1, description="the base directory, e.g. `host_path: /mnt/ckpts`")
    storage_path: str | None = Field(
        default=None, min_length=1, description="a sub-directory of host_path, e.g. `storage_path: my-exp`"
    )


class DirectoryStorage(_StorageBase):
    """A plain local directory."""

    type: Literal["directory"] = "directory"
    container_path: str = Field(min_length=1, description="the directory, e.g. `container_path: ./ckpts`")


class S3Storage(_StorageBase):
    """An S3 (or S3-compatible) bucket."""

    type: Literal["s3"] = "s3"
    bucket: str = Field(min_length=1, description="the bucket name, e.g. `bucket: my-checkpoints`")
    prefix: str | None = Field(default=None, description="a key prefix inside the bucket")
    endpoint_url: str | None = Field(default=None, description="e.g. `endpoint_url: http://127.0.0.1:9000`")
    access_key: str | None = None
    secret_key: str | None = None
    region: str | None = None


class GCSStorage(_StorageBase):
    """A Google Cloud Storage bucket (Application Default Credentials; an emulator via `STORAGE_EMULATOR_HOST`)."""

    type: Literal["gcs"] = "gcs"
    bucket: str = Field(min_length=1, description="the bucket name, e.g. `bucket: my-checkpoints`")
    prefix: str | None = Field(default=None, description="an object name prefix inside the bucket")
    endpoint_url: str | None = Field(
        default=None, description="an emulator or other endpoint, reached without Google credentials, e.g. "
        "`endpoint_url: http://127.0.0.1:9023` (local addition; STORAGE_EMULATOR_HOST does the same)")


class AzureStorage(_StorageBase):
    """An Azure Blob Storage container: `connection_string`, or `account_url` [+ `credential`]."""

    type: Literal["azure"] = "azure"
    container: str = Field(min_length=1, description="the container name, e.g. `container: checkpoints`")
    prefix: str | None = Field(default=None, description="a blob name prefix inside the container (local addition)")
    connection_string: str | None = Field(
        default=None, min_length=1, description="the storage account's connection string (Azurite's development "
        "one works)")
    account_url: str | None = Field(
        default=None, min_length=1, description="e.g. `account_url: https://myaccount.blob.core.windows.net`")
    credential: str | None = Field(
        default=None, min_length=1, description="with account_url: an account key or a SAS token")

    @model_validator(mode="after")
    def _one_way_in(self) -> AzureStorage:
        if (self.connection_string is None) == (self.account_url is None):
            raise ValueError("give exactly one of connection_string and account_url (with credential)")
        if self.credential is not None and self.account_url is None:
            raise ValueError("credential goes with account_url, not with connection_string")
        return self


def _untyped(value: Any) -> str | None:
    return "_path" if isinstance(value, str) else None


StorageConfig = tagged_union(
    {
        "shared_fs": SharedFSStorage, "directory": DirectoryStorage, "s3": S3Storage, "gcs": GCSStorage,
        "azure": AzureStorage,
        "_path": Annotated[str, Field(min_length=1)],
    },
    key="type",
    what="a directory path, an `s3://`, `gs://` or `az://` URI, or a mapping with `type:`",
    fallback=_untyped,
    nullable=True,
)
"""`checkpoint_storage`: None, a path or URI string, or a shared_fs/directory/s3/gcs/azure mapping."""
