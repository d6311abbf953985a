"""AzureStorage: checkpoints under ``az://container/prefix/<storage id>/`` via azure-storage-blob (imported
lazily; the layout and the completeness mark are RemoteStorage's)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

from determined_trials.config import AzureStorage as AzureSection
from determined_trials.core.storage._base import StorageError
from determined_trials.core.storage._remote import RemoteStorage, require_package

__all__ = ["AzureStorage"]

_CONNECT_RETRIES = 3
"""Attempts to connect before an unreachable endpoint is an error (the SDK's own backoff between them)."""
_CONCURRENCY = 4
"""Parallel block transfers of one large blob (the SDK's default is 1)."""
_DELETE_BATCH = 256  # the most sub-requests one blob batch takes


class AzureStorage(RemoteStorage):
    """Checkpoints in an Azure Blob Storage container.

    Reached with a connection string (also Azurite's development one), or an account URL with a
    credential (an account key or a SAS token; none: anonymous access, e.g. a SAS already in the URL).
    """

    scheme, service, name_key = "az", "Azure", "container"
    client_loggers = ("azure",)  # azure-core logs each request's and response's headers at INFO
    name_pattern = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$")
    name_rule = ("3-63 characters of lowercase letters, digits and single '-' between them, starting with a "
                 "letter or digit")

    def __init__(self, section: AzureSection) -> None:
        super().__init__(section.container, section.prefix)
        require_package("azure.storage.blob", "azure", "Azure")
        self._connection_string = section.connection_string
        self.account_url = section.account_url
        self._credential = section.credential

    @property
    def container(self) -> str:
        """The container's name (``bucket`` in the shared code)."""
        return self.bucket

    def _endpoint(self) -> str | None:
        return self.account_url or _blob_endpoint(self._connection_string or "")

    def _make_client(self) -> Any:
        from azure.storage.blob import ContainerClient

        options: dict[str, Any] = {"retry_connect": _CONNECT_RETRIES, "connection_timeout": 20}
        if self._connection_string:
            try:
                return ContainerClient.from_connection_string(
                    self._connection_string, container_name=self.bucket, **options)
            except ValueError as exc:
                raise StorageError(
                    f"checkpoint_storage.connection_string for Azure container {self.bucket!r} is not a valid "
                    f"connection string ({exc}); copy it from the storage account's Access keys page"
                ) from exc
        return ContainerClient(self.account_url or "", self.bucket, credential=self._credential, **options)

    def _check_bucket(self, client: Any) -> None:
        pages = client.list_blobs(name_starts_with=self.prefix or None, results_per_page=1).by_page()
        next(iter(next(pages, [])), None)  # listing is what checkpoints need

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Turn azure-core failures into StorageErrors that say what to check."""
        from azure.core import exceptions as az

        try:
            yield
        except az.ResourceNotFoundError as exc:
            if "ContainerNotFound" not in str(getattr(exc, "error_code", "") or exc):
                raise StorageError(f"Azure error while {action} on {self.describe()}: {_one_line(exc)}") from exc
            raise StorageError(
                f"Azure container {self.bucket!r} does not exist ({self.describe()}); create it or fix "
                "checkpoint_storage.container"
            ) from exc
        except (az.ClientAuthenticationError, az.HttpResponseError) as exc:
            if isinstance(exc, az.HttpResponseError) and getattr(exc, "status_code", None) not in (401, 403):
                raise StorageError(f"Azure error while {action} on {self.describe()}: {_one_line(exc)}") from exc
            raise StorageError(
                f"Azure refused {action} on container {self.bucket!r} ({self.describe()}): "
                f"{_one_line(exc)}; check the account key in checkpoint_storage.connection_string "
                "(or credential), that the SAS has not expired, and that it may list, read, write and delete"
            ) from exc
        except (az.ServiceRequestError, az.ServiceResponseError) as exc:
            raise StorageError(
                f"cannot reach the Azure blob endpoint of container {self.bucket!r} ({self.describe()}) while "
                f"{action}: {_one_line(exc)}; check the BlobEndpoint/AccountName in the connection string (or "
                "account_url) and the network"
            ) from exc
        except az.AzureError as exc:
            raise StorageError(f"Azure error while {action} on {self.describe()}: {_one_line(exc)}") from exc

    # -- object operations ---------------------------------------------------------------------------
    def _upload_file(self, key: str, path: str) -> None:
        with open(path, "rb") as f:
            self._client.upload_blob(key, f, overwrite=True, max_concurrency=_CONCURRENCY)

    def _upload_bytes(self, key: str, data: bytes) -> None:
        self._client.upload_blob(key, data, overwrite=True)

    def _read_bytes(self, key: str) -> bytes | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            data: bytes = self._client.download_blob(key).readall()
        except ResourceNotFoundError as exc:
            if "BlobNotFound" not in str(getattr(exc, "error_code", "") or exc):
                raise
            return None
        return data

    def _list(self, prefix: str) -> Iterator[tuple[str, int]]:
        for blob in self._client.list_blobs(name_starts_with=prefix or None):
            yield blob.name, int(blob.size or 0)

    def _download_file(self, key: str, path: str) -> None:
        with open(path, "wb") as f:
            self._client.download_blob(key, max_concurrency=_CONCURRENCY).readinto(f)

    def _delete_keys(self, keys: Sequence[str]) -> None:
        for i in range(0, len(keys), _DELETE_BATCH):
            replies = self._client.delete_blobs(*keys[i : i + _DELETE_BATCH], raise_on_any_failure=False)
            failed = [r for r in replies if r.status_code not in (200, 202, 404)]  # 404: vanished since listed
            if failed:
                raise StorageError(
                    f"Azure refused deleting {len(failed)} blob(s) of {self.describe()} (HTTP "
                    f"{failed[0].status_code}); check that the credentials may delete blobs"
                )


def _one_line(exc: Exception) -> str:
    """An azure-core error in one line: its message's first line and its error code (never the response's raw
    XML body), with what to fix where we know it."""
    lines = str(getattr(exc, "message", None) or exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    code = getattr(exc, "error_code", None)
    code = getattr(code, "value", code)  # the SDK's StorageErrorCode enum: its wire name
    if code and str(code) not in text:
        text += f" ({code})"
    if "API version" in text and "not supported" in text:
        text += "; start Azurite with --skipApiVersionCheck (the SDK is newer than the emulator)"
    return text


def _blob_endpoint(connection_string: str) -> str | None:
    """The BlobEndpoint of a connection string (an emulator's, a private one), for messages; never the key."""
    for part in connection_string.split(";"):
        name, _, value = part.partition("=")
        if name.strip().lower() == "blobendpoint" and value:
            return value.strip()
    return None
