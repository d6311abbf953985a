"""S3Storage: checkpoints under ``s3://bucket/prefix/<storage id>/`` via boto3, metadata.json uploaded last."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from determined_trials.core.storage._base import (
    METADATA_FILE,
    CheckpointNotFoundError,
    Selector,
    StorageError,
    StorageManager,
    check_storage_id,
    dump_metadata,
    safe_join,
)
from determined_trials.errors import ConfigError

__all__ = ["S3Storage"]

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_DELETE_BATCH = 1000


class S3Storage(StorageManager):
    """Checkpoints in an S3 (or S3-compatible) bucket.

    Credentials and region default to boto3's usual sources (``AWS_*`` variables, config files);
    the endpoint to ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``. Every rank uploads its own files to
    ``<prefix>/<id>/``; after all ranks are done the chief
    uploads ``metadata.json``. A prefix without ``metadata.json`` (a writer that crashed) is treated
    as absent. Restores download into a temporary folder that is removed afterwards.
    """

    direct_access = False

    def __init__(
        self,
        bucket: str,
        prefix: str | None = None,
        *,
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str | None = None,
    ) -> None:
        if not isinstance(bucket, str) or not _BUCKET_RE.match(bucket):
            raise ConfigError(
                f"invalid S3 bucket name {bucket!r}: use 3-63 characters of lowercase letters, digits, "
                "'.' and '-', starting and ending with a letter or digit (checkpoint_storage.bucket)"
            )
        self.bucket = bucket
        self.prefix = (prefix or "").strip("/")
        env = os.environ
        self.endpoint_url = endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        self._credentials = {"access_key": access_key, "secret_key": secret_key, "region": region}
        self._client_obj: Any = None
        self._scratch: dict[tuple[str, int], Path] = {}

    def describe(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return f"{where} (endpoint {self.endpoint_url})" if self.endpoint_url else where

    # -- plumbing ----------------------------------------------------------------------------------
    @property
    def _client(self) -> Any:
        if self._client_obj is None:
            self._client_obj = self._make_client()
            with self._errors("checking the bucket"):
                self._client_obj.head_bucket(Bucket=self.bucket)
        return self._client_obj

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
            raise StorageError(f"cannot reach S3 endpoint for {self.describe()}: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"S3 failure while {action} on {self.describe()}: {exc}") from exc

    def _key(self, storage_id: str, rel: str = "") -> str:
        base = f"{self.prefix}/{check_storage_id(storage_id)}/" if self.prefix else f"{storage_id}/"
        return base + rel

    def _iter_objects(self, prefix: str) -> Iterator[dict[str, Any]]:
        client = self._client
        with self._errors(f"listing {prefix!r}"):
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                yield from page.get("Contents", [])

    # -- writing -----------------------------------------------------------------------------------
    def stage_dir(self, storage_id: str, rank: int) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"det-ckpt-{check_storage_id(storage_id)[:8]}-r{int(rank)}-"))
        self._scratch[(storage_id, int(rank))] = path
        return path

    def put(self, storage_id: str, rank: int, src: Path, files: Sequence[str]) -> None:
        client = self._client
        for rel in files:
            if rel == METADATA_FILE:
                raise StorageError(f"{METADATA_FILE} is written by commit(), not put(); leave it out")
            with self._errors(f"uploading {rel!r}"):
                client.upload_file(str(safe_join(Path(src), rel)), self.bucket, self._key(storage_id, rel))

    def release(self, storage_id: str, rank: int) -> None:
        path = self._scratch.pop((storage_id, int(rank)), None)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)

    def commit(self, storage_id: str, metadata: dict[str, Any]) -> dict[str, int]:
        client = self._client
        with self._errors("uploading metadata.json"):
            key = self._key(storage_id, METADATA_FILE)
            client.put_object(Bucket=self.bucket, Key=key, Body=dump_metadata(metadata))
        return self.list_files(storage_id)

    def abort(self, storage_id: str) -> None:
        for key in [k for k in self._scratch if k[0] == storage_id]:
            self.release(*key)
        with contextlib.suppress(StorageError):
            self.delete(storage_id)

    # -- reading -----------------------------------------------------------------------------------
    def exists(self, storage_id: str) -> bool:
        from botocore.exceptions import ClientError

        client = self._client
        try:
            client.head_object(Bucket=self.bucket, Key=self._key(storage_id, METADATA_FILE))
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in ("404", "NoSuchKey", "NotFound"):
                return False
            with self._errors("reading metadata.json"):
                raise
        return True

    def _require(self, storage_id: str) -> None:
        if not self.exists(storage_id):
            raise CheckpointNotFoundError(storage_id, self.describe())

    def list_checkpoints(self) -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        found = set()
        for obj in self._iter_objects(base):
            parts = obj["Key"][len(base) :].split("/")
            if len(parts) == 2 and parts[1] == METADATA_FILE and not parts[0].startswith("."):
                found.add(parts[0])
        return sorted(found)

    def list_files(self, storage_id: str) -> dict[str, int]:
        self._require(storage_id)
        base = self._key(storage_id)
        files = {obj["Key"][len(base) :]: int(obj["Size"]) for obj in self._iter_objects(base)}
        return dict(sorted(files.items()))

    def read_metadata(self, storage_id: str) -> dict[str, Any]:
        self._require(storage_id)
        with self._errors("reading metadata.json"):
            body = self._client.get_object(Bucket=self.bucket, Key=self._key(storage_id, METADATA_FILE))["Body"]
            data = json.loads(body.read())
        if not isinstance(data, dict):
            raise StorageError(f"metadata.json of {storage_id!r} in {self.describe()} is not a JSON object")
        return data

    def download(self, storage_id: str, dst: Path, selector: Selector | None = None) -> None:
        files = [f for f in self.list_files(storage_id) if selector is None or selector(f)]
        self.download_files(storage_id, dst, files)

    def download_files(self, storage_id: str, dst: Path, files: Sequence[str]) -> None:
        client = self._client
        Path(dst).mkdir(parents=True, exist_ok=True)
        for rel in files:
            target = safe_join(Path(dst), rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            with self._errors(f"downloading {rel!r}"):
                client.download_file(self.bucket, self._key(storage_id, rel), str(target))

    def delete(self, storage_id: str) -> bool:
        keys = [obj["Key"] for obj in self._iter_objects(self._key(storage_id))]
        if not keys:
            return False
        meta = self._key(storage_id, METADATA_FILE)
        # metadata.json goes first: from then on readers treat the rest as absent.
        ordered = ([meta] if meta in keys else []) + [k for k in keys if k != meta]
        client = self._client
        with self._errors(f"deleting {storage_id!r}"):
            client.delete_object(Bucket=self.bucket, Key=ordered[0])
            rest = ordered[1:]
            for i in range(0, len(rest), _DELETE_BATCH):
                batch = [{"Key": k} for k in rest[i : i + _DELETE_BATCH]]
                client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
        return True
