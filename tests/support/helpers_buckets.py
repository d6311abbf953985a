"""Object-store servers for the checkpoint storage tests, started on 127.0.0.1 (free ports) and stopped by
the fixtures: moto's S3 server, the GCS emulator (``gcp-storage-emulator``) and Azurite. ``bucket_spec(kind,
server)`` makes a fresh bucket or container and returns its ``checkpoint_storage`` mapping.

Azurite's ``azurite-blob`` is ``$DET_TEST_AZURITE`` if set, else ``<repo>/.venv/azurite/node_modules/.bin/
azurite-blob`` (``make azurite``, which ``make test`` runs); without it the Azure tests skip, except under CI
(``$CI`` set), where a missing server fails instead of skipping silently.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.helpers_paths import REPO

__all__ = [
    "AZURITE_KEY", "BUCKETS", "S3_KEYS", "azure_connection_string", "azure_server_fixture", "azurite",
    "azurite_path", "bucket_server", "bucket_spec", "free_port", "gcs_emulator", "gcs_emulator_path",
    "gcs_server_fixture", "list_keys", "missing_server", "s3_server_fixture",
]

BUCKETS = ("s3", "gcs", "azure")
S3_KEYS = {"access_key": "testing", "secret_key": "testing", "region": "us-east-1"}
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's documented development account key (public, for the emulator only)."""
_AZURITE_ENV = "DET_TEST_AZURITE"
_START_S = 60.0  # a server's start under a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def missing_server(what: str) -> None:
    """Skip (locally) or fail (under CI) for a server that is not installed."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI must run these tests, not skip them)")
    pytest.skip(what)


@contextlib.contextmanager
def _serving(cmd: list[str], port: int) -> Iterator[None]:
    """Run ``cmd`` until the port accepts connections; kill and reap it on the way out."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + _START_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
                    raise RuntimeError(f"{cmd[0]} did not start on port {port} (exit {proc.poll()}): {err}") from None
                time.sleep(0.05)  # polling for the port, not synchronising on time
        yield
    finally:
        proc.kill()  # in-memory / temporary data only: nothing to shut down gracefully
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.fixture(scope="session", name="s3_server")
def s3_server_fixture() -> Iterator[str]:
    """moto's S3 server (in this process); yields its endpoint URL."""
    pytest.importorskip("moto")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def gcs_emulator_path() -> str | None:
    """The gcp-storage-emulator script beside this Python, else on PATH."""
    script = Path(sys.executable).parent / "gcp-storage-emulator"
    return str(script) if script.exists() else shutil.which("gcp-storage-emulator")


@contextlib.contextmanager
def gcs_emulator(script: str) -> Iterator[str]:
    """gcp-storage-emulator (in memory) on a free port; yields its endpoint URL (what STORAGE_EMULATOR_HOST takes)."""
    port = free_port()
    with _serving([script, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"], port):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def azurite(binary: str, *, skip_api_version_check: bool = True) -> Iterator[str]:
    """Azurite's blob service on a free port, data in a temporary folder; yields its connection string.
    Without ``skip_api_version_check`` it refuses an SDK newer than itself, as a user's plain start does."""
    port = free_port()
    flags = ["--skipApiVersionCheck"] if skip_api_version_check else []
    with tempfile.TemporaryDirectory(prefix="det-azurite-") as location, _serving(
        [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", location, "--silent",
         *flags], port):
        yield azure_connection_string(port)


@pytest.fixture(scope="session", name="gcs_server")
def gcs_server_fixture() -> Iterator[str]:
    """The GCS emulator for the session's tests; yields its endpoint URL."""
    pytest.importorskip("google.cloud.storage")
    found = gcs_emulator_path()
    if found is None:
        missing_server("gcp-storage-emulator is not installed (make venv installs it)")
    with gcs_emulator(str(found)) as endpoint:
        yield endpoint


def azurite_path() -> str | None:
    override = os.environ.get(_AZURITE_ENV)
    if override:
        return override  # a wrong path then fails loudly at start, rather than skipping
    default = REPO / ".venv/azurite/node_modules/.bin/azurite-blob"
    return str(default) if default.exists() else None


@pytest.fixture(scope="session", name="azure_server")
def azure_server_fixture() -> Iterator[str]:
    """Azurite for the session's tests; yields its connection string."""
    pytest.importorskip("azure.storage.blob")
    found = azurite_path()
    if found is None:
        missing_server(f"Azurite is not installed: run `make azurite` (or set {_AZURITE_ENV} to azurite-blob)")
    with azurite(str(found)) as connection_string:
        yield connection_string


def azure_connection_string(port: int, key: str = AZURITE_KEY) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};")


def bucket_server(request: pytest.FixtureRequest, kind: str) -> str:
    """The running server of ``kind`` (its session fixture, started on first use)."""
    return str(request.getfixturevalue(f"{kind}_server"))


def bucket_spec(kind: str, server: str, prefix: str = "runs/exp1") -> dict[str, Any]:
    """A new, empty bucket (container) on ``server`` as a checkpoint_storage mapping."""
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    if kind == "s3":
        from determined_trials import config
        from determined_trials.core.storage import S3Storage

        spec = {"type": "s3", "bucket": name, "prefix": prefix, "endpoint_url": server, **S3_KEYS}
        S3Storage(config.S3Storage(**spec))._make_client().create_bucket(Bucket=name)
        return spec
    if kind == "gcs":
        from google.cloud import storage

        storage.Client(client_options={"api_endpoint": server}, use_auth_w_custom_endpoint=False).create_bucket(name)
        return {"type": "gcs", "bucket": name, "prefix": prefix, "endpoint_url": server}
    from azure.storage.blob import BlobServiceClient

    BlobServiceClient.from_connection_string(server).create_container(name)
    return {"type": "azure", "container": name, "prefix": prefix, "connection_string": server}


def list_keys(storage: Any) -> list[str]:
    """Every object key in the storage's bucket, complete checkpoints or not."""
    return sorted(key for key, _size in storage._iter_objects(""))
