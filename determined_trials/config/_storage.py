"""The `checkpoint_storage` section: a path/URI string or a mapping chosen by `type`, every rule about it,
and `parse_storage`, which turns each accepted form into one typed section (what the backends take)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlparse

from pydantic import AfterValidator, Field, ValidationError, create_model, model_validator

from determined_trials.config._base import ConfigProblems, StrictModel, tagged_union
from determined_trials.config._det_keys import drop_unused_keys
from determined_trials.config._errors import problems_from_validation, raise_problems

__all__ = ["AZURE_CONNECTION_ENV", "AzureStorage", "DirectoryStorage", "GCSStorage", "S3Storage", "SharedFSStorage",
           "StorageConfig", "StorageSection", "parse_storage"]

AZURE_CONNECTION_ENV = "AZURE_STORAGE_CONNECTION_STRING"
"""Where an ``az://`` URI takes its connection string from."""
_URIS = ("a directory path, file:///path, s3://<bucket>[/<prefix>], gs://<bucket>[/<prefix>] or "
         "az://<container>[/<prefix>]")
_SCHEMES = {"s3": ("s3", "bucket"), "gs": ("gcs", "bucket"), "az": ("azure", "container")}
"""URI scheme -> the storage type and the key that names its bucket."""


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

    @model_validator(mode="after")
    def _inside_host_path(self) -> SharedFSStorage:
        path = Path(self.storage_path or "").expanduser()
        if path.is_absolute() and not path.resolve().is_relative_to(Path(self.host_path).expanduser().resolve()):
            raise ConfigProblems.at(("storage_path",), (
                f"{self.storage_path!r} lies outside host_path {self.host_path!r}. Fix: make it relative to "
                "host_path or a folder inside it"))
        return self

    @property
    def directory(self) -> Path:
        """host_path, or storage_path inside it (a relative storage_path is taken relative to host_path)."""
        host = Path(self.host_path).expanduser()
        return host if self.storage_path is None else host / Path(self.storage_path).expanduser()


class DirectoryStorage(_StorageBase):
    """A plain local directory."""

    type: Literal["directory"] = "directory"
    container_path: str = Field(min_length=1, description="the directory, e.g. `container_path: ./ckpts`")

    @property
    def directory(self) -> Path:
        """container_path, with ``~`` expanded."""
        return Path(self.container_path).expanduser()


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
            given = "both" if self.account_url is not None else "neither"
            raise ValueError(f"give exactly one of connection_string and account_url (with credential); {given} "
                             "given. Fix: keep connection_string, or account_url with an optional credential")
        if self.credential is not None and self.account_url is None:
            raise ConfigProblems.at(("credential",), "credential goes with account_url, not with "
                                    "connection_string. Fix: drop it (the connection string holds the key)")
        return self


StorageSection = SharedFSStorage | DirectoryStorage | S3Storage | GCSStorage | AzureStorage
"""A parsed `checkpoint_storage` mapping: what `parse_storage` returns and the backends take."""


def _uri_section(text: str) -> dict[str, Any]:
    """The section a path or URI names, as a mapping; ValueError saying what is wrong and how to fix it."""
    if not text.strip():
        raise ValueError(f"is blank. Fix: give {_URIS}")
    if "://" not in text:
        return {"type": "directory", "container_path": text}
    url = urlparse(text)
    if url.scheme == "file":
        return {"type": "directory", "container_path": url.path}
    if url.scheme not in _SCHEMES:
        raise ValueError(f"URI scheme {url.scheme!r} is not supported ({text!r}). Fix: use {_URIS}")
    kind, key = _SCHEMES[url.scheme]
    if not url.netloc:
        raise ValueError(f"{text!r} names no {key}. Fix: write {url.scheme}://<{key}>[/<prefix>]")
    return {"type": kind, key: url.netloc, "prefix": url.path.strip("/")}


def _checked_uri(text: str) -> str:
    _uri_section(text)
    return text


def _untyped(value: Any) -> str | None:
    return "_path" if isinstance(value, str) else None


StorageConfig = tagged_union(
    {
        "shared_fs": SharedFSStorage, "directory": DirectoryStorage, "s3": S3Storage, "gcs": GCSStorage,
        "azure": AzureStorage,
        "_path": Annotated[str, AfterValidator(_checked_uri)],
    },
    key="type",
    what=f"{_URIS}, or a mapping with `type:`",
    fallback=_untyped,
    nullable=True,
)
"""`checkpoint_storage`: None, a path or URI string, or a shared_fs/directory/s3/gcs/azure mapping."""


@runtime_checkable
class _Dumps(Protocol):
    """A config object other than a section (a pydantic model, a look-alike): read as its mapping."""

    def model_dump(self) -> Mapping[str, Any]: ...


_Holder = create_model("_Holder", __base__=StrictModel, checkpoint_storage=(StorageConfig, ...))
"""`checkpoint_storage` alone, so that its problems are located and worded as in an experiment config."""


def _validated(value: Any) -> StorageSection | str | None:
    try:
        parsed: StorageSection | str | None = dict(_Holder.model_validate({"checkpoint_storage": value}))[
            "checkpoint_storage"]
    except ValidationError as exc:
        raise_problems(problems_from_validation(exc, _Holder), what="checkpoint storage")
    return parsed


def _from_uri(text: str) -> dict[str, Any]:
    """The section of a path or URI; an ``az://`` URI's connection string is the environment's."""
    section = _uri_section(text)
    if section["type"] == "azure":
        section["connection_string"] = os.environ.get(AZURE_CONNECTION_ENV) or None
        if section["connection_string"] is None:
            raise_problems([(("checkpoint_storage",), (
                f"{text!r} takes its connection string from {AZURE_CONNECTION_ENV}, which is not set. Fix: set "
                "it, or write checkpoint_storage as {type: azure, container: ..., connection_string: ...}"))],
                what="checkpoint storage")
    return section


def parse_storage(spec: Any) -> StorageSection | None:
    """The typed section of a ``checkpoint_storage`` value, or None (the caller's default directory).

    ``spec`` is a path (str or PathLike) or a ``file://``, ``s3://``, ``gs://`` or ``az://`` URI (its
    connection string from ``AZURE_STORAGE_CONNECTION_STRING``), a mapping (path values may be PathLike),
    a section (returned as is) or another object with ``model_dump()``. Raises ``ConfigError`` naming each
    problem's key and its fix, worded as in an experiment config.
    """
    if isinstance(spec, StorageSection) or spec is None:
        return spec
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    elif isinstance(spec, _Dumps):
        spec = spec.model_dump()
    if isinstance(spec, Mapping):
        spec = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in spec.items()}
    parsed = _validated(spec)
    if isinstance(parsed, str):
        parsed = _validated(_from_uri(parsed))
        assert not isinstance(parsed, str)
    return parsed
