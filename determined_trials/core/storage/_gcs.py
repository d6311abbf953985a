"""GCSStorage: checkpoints under ``gs://bucket/prefix/<storage id>/`` via google-cloud-storage (imported lazily;
the layout and the completeness mark are RemoteStorage's)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

from determined_trials.config import GCSStorage as GCSSection
from determined_trials.core.storage._base import StorageError
from determined_trials.core.storage._remote import RemoteStorage, require_package

__all__ = ["GCSStorage"]

_CHECK_TIMEOUT_S = 30.0
"""How long the start-up check retries an endpoint that does not answer before it gives up."""


class GCSStorage(RemoteStorage):
    """Checkpoints in a Google Cloud Storage bucket.

    Credentials are Google's Application Default Credentials (``gcloud auth application-default login``,
    ``GOOGLE_APPLICATION_CREDENTIALS``, a VM's service account), as for every Google client. An emulator
    is reached through ``STORAGE_EMULATOR_HOST`` or ``endpoint_url``, with anonymous credentials, as
    google-cloud-storage itself does for a custom endpoint.
    """

    scheme, service = "gs", "GCS"
    client_loggers = ("google.auth", "google.cloud", "urllib3")
    name_pattern = re.compile(r"^[a-z0-9][a-z0-9._\-]{1,220}[a-z0-9]$")
    name_rule = ("3-63 characters of lowercase letters, digits, '-', '_' and '.', starting and ending with a "
                 "letter or digit")

    def __init__(self, section: GCSSection) -> None:
        super().__init__(section.bucket, section.prefix)
        require_package("google.cloud.storage", "gcs", "GCS")
        self.endpoint_url = section.endpoint_url or None

    def _endpoint(self) -> str | None:
        return self.endpoint_url or os.environ.get("STORAGE_EMULATOR_HOST") or None

    def _make_client(self) -> Any:
        from google.cloud import storage

        if self.endpoint_url:
            client = storage.Client(client_options={"api_endpoint": self.endpoint_url},
                                    use_auth_w_custom_endpoint=False)
        else:
            client = storage.Client()
        return client.bucket(self.bucket)

    def _check_bucket(self, client: Any) -> None:
        from google.api_core.retry import Retry
        from google.cloud.storage.retry import DEFAULT_RETRY

        retry: Retry = DEFAULT_RETRY.with_timeout(_CHECK_TIMEOUT_S)
        pages = client.client.list_blobs(client, prefix=self.prefix, max_results=1, retry=retry).pages
        next(pages, None)  # listing is what checkpoints need: objects.list, not buckets.get

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Turn google-cloud-storage and google-auth failures into StorageErrors that say what to check."""
        import requests
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        try:
            yield
        except api.NotFound as exc:
            if action != "checking the bucket":
                raise StorageError(f"GCS error while {action} on {self.describe()}: {exc}") from exc
            raise StorageError(
                f"GCS bucket {self.bucket!r} does not exist ({self.describe()}); create it or fix "
                "checkpoint_storage.bucket"
            ) from exc
        except (api.Forbidden, api.Unauthorized, auth.RefreshError) as exc:
            raise StorageError(
                f"GCS refused {action} on bucket {self.bucket!r} ({self.describe()}): {exc}; check the "
                "credentials (gcloud auth application-default login, GOOGLE_APPLICATION_CREDENTIALS) and "
                "that they may list, read and write objects in the bucket"
            ) from exc
        except auth.DefaultCredentialsError as exc:
            raise StorageError(
                f"no usable Google credentials for GCS bucket {self.bucket!r} ({self.describe()}): {exc}; run "
                "`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a service "
                "account key file (for an emulator: STORAGE_EMULATOR_HOST or checkpoint_storage.endpoint_url)"
            ) from exc
        except (api.RetryError, requests.ConnectionError, auth.TransportError) as exc:
            raise StorageError(
                f"cannot reach the GCS endpoint of bucket {self.bucket!r} ({self.describe()}) while {action}: "
                f"{exc}; check checkpoint_storage.endpoint_url / STORAGE_EMULATOR_HOST and the network"
            ) from exc
        except (api.GoogleAPICallError, requests.RequestException) as exc:
            raise StorageError(f"GCS error while {action} on {self.describe()}: {exc}") from exc

    # -- object operations ---------------------------------------------------------------------------
    def _upload_file(self, key: str, path: str) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        # A fresh key per checkpoint file: retrying an unconditional upload is safe here.
        self._client.blob(key).upload_from_filename(path, retry=DEFAULT_RETRY)

    def _upload_bytes(self, key: str, data: bytes) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        self._client.blob(key).upload_from_string(data, content_type="application/json", retry=DEFAULT_RETRY)

    def _read_bytes(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            data: bytes = self._client.blob(key).download_as_bytes()
        except NotFound:
            return None
        return data

    def _list(self, prefix: str) -> Iterator[tuple[str, int]]:
        for blob in self._client.client.list_blobs(self._client, prefix=prefix):
            yield blob.name, int(blob.size or 0)

    def _download_file(self, key: str, path: str) -> None:
        self._client.blob(key).download_to_filename(path)

    def _delete_keys(self, keys: Sequence[str]) -> None:
        self._client.delete_blobs(list(keys), on_error=lambda _blob: None)  # called for a vanished key only
