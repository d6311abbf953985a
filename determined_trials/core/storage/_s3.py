"""S3Storage: checkpoints under ``s3://bucket/prefix/<storage id>/`` via boto3 (the layout and the
completeness mark are RemoteStorage's)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

from determined_trials.config import S3Storage as S3Section
from determined_trials.core.storage._base import StorageError
from determined_trials.core.storage._remote import RemoteStorage

__all__ = ["S3Storage"]

_DELETE_BATCH = 1000


class S3Storage(RemoteStorage):
    """Checkpoints in an S3 (or S3-compatible) bucket.

    Credentials and region default to boto3's usual sources (``AWS_*`` variables, config files);
    the endpoint to ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``. Every rank uploads its own files to
    ``<prefix>/<id>/``; after all ranks are done the chief uploads ``metadata.json``. A prefix without
    ``metadata.json`` (a writer that crashed) is treated as absent. Restores download into a temporary
    folder that is removed afterwards.
    """

    scheme, service = "s3", "S3"
    client_loggers = ("boto3", "botocore", "s3transfer", "urllib3")  # botocore: INFO when it finds credentials
    name_pattern = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
    name_rule = "3-63 characters of lowercase letters, digits, '.' and '-', starting and ending with a letter or digit"

    def __init__(self, section: S3Section) -> None:
        super().__init__(section.bucket, section.prefix)
        env = os.environ
        self.endpoint_url = (section.endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
                             or None)
        self._credentials = {"access_key": section.access_key, "secret_key": section.secret_key,
                             "region": section.region}

    def _endpoint(self) -> str | None:
        return self.endpoint_url

    def _make_client(self) -> Any:
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(
            aws_access_key_id=self._credentials["access_key"],
            aws_secret_access_key=self._credentials["secret_key"],
            region_name=self._credentials["region"],
        )
        config = Config(
            connect_timeout=10,
            read_timeout=120,
            retries={"max_attempts": 3, "mode": "standard"},
            s3={"addressing_style": "path"} if self.endpoint_url else {},
        )
        return session.client("s3", endpoint_url=self.endpoint_url, config=config)

    def _check_bucket(self, client: Any) -> None:
        client.head_bucket(Bucket=self.bucket)

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Turn botocore failures into StorageError messages that say what to fix."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
        )

        try:
            yield
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchBucket", "404") and action == "checking the bucket":
                raise StorageError(
                    f"S3 bucket {self.bucket!r} does not exist ({self.describe()}); create it or fix "
                    "checkpoint_storage.bucket"
                ) from exc
            if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise StorageError(
                    f"S3 refused {action} on {self.describe()} ({code}); check access_key/secret_key "
                    "(or the AWS_* environment variables) and the bucket policy"
                ) from exc
            raise StorageError(f"S3 error while {action} on {self.describe()}: {exc}") from exc
        except NoCredentialsError as exc:
            raise StorageError(
                f"no S3 credentials for {self.describe()}: set checkpoint_storage access_key and "
                "secret_key, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            ) from exc
        except EndpointConnectionError as exc:
            raise StorageError(
                f"cannot reach the S3 endpoint of bucket {self.bucket!r} ({self.describe()}): {exc}; check "
                "checkpoint_storage.endpoint_url (or AWS_ENDPOINT_URL) and the network"
            ) from exc
        except BotoCoreError as exc:
            raise StorageError(f"S3 failure while {action} on {self.describe()}: {exc}") from exc

    # -- object operations ---------------------------------------------------------------------------
    def _upload_file(self, key: str, path: str) -> None:
        self._client.upload_file(path, self.bucket, key)

    def _upload_bytes(self, key: str, data: bytes) -> None:
        self._client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def _read_bytes(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        data: bytes = body.read()
        return data

    def _list(self, prefix: str) -> Iterator[tuple[str, int]]:
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                yield obj["Key"], int(obj["Size"])

    def _download_file(self, key: str, path: str) -> None:
        self._client.download_file(self.bucket, key, path)

    def _delete_keys(self, keys: Sequence[str]) -> None:
        for i in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": k} for k in keys[i : i + _DELETE_BATCH]]
            self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
