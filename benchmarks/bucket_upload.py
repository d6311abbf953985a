"""Upload of a checkpoint to a bucket through our storage against the client library's own plain upload.

Usage: python benchmarks/bucket_upload.py [--rounds 7] [--mb 200] [--quick]

A checkpoint folder of ``--mb`` MB (three files: 3/4 weights, 1/4 optimizer state, a small JSON) is
uploaded to the GCS emulator (gcp-storage-emulator) and to Azurite, both on 127.0.0.1, each round both
ways, interleaved: ``CheckpointContext.upload`` (our storage: every file, metadata.json last, the listing
that records the checkpoint's resources) and the same files with the library's plain call
(``Blob.upload_from_filename``; ``ContainerClient.upload_blob`` with its defaults). Prints per backend the
median of the per-round ratios (ours / plain) and the median times. Azurite is ``$DET_TEST_AZURITE`` or
``<repo>/.venv/azurite/node_modules/.bin/azurite-blob`` (``make azurite``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from helpers_buckets import azurite, azurite_path, bucket_spec, gcs_emulator, gcs_emulator_path  # noqa: E402

from determined_trials.core import CheckpointContext  # noqa: E402
from determined_trials.core._distributed import dummy_distributed  # noqa: E402
from determined_trials.core.storage import RemoteStorage, storage_from_spec  # noqa: E402

__all__ = ["main"]


def _write_checkpoint(folder: Path, total_mb: int) -> list[str]:
    """Three files of random bytes (incompressible, as weights are), about ``total_mb`` MB together."""
    sizes = {"state_dict.pth": total_mb * 3 // 4, "optimizer.pth": total_mb - total_mb * 3 // 4}
    for name, mb in sizes.items():
        with open(folder / name, "wb") as f:
            for _ in range(mb):
                f.write(os.urandom(1_000_000))
    (folder / "trial_state.json").write_text('{"batches_trained": 1000}')
    return [*sizes, "trial_state.json"]


def _plain_upload(kind: str, spec: dict[str, Any]) -> tuple[Callable[[Path, list[str]], str], Callable[[str], None]]:
    """The client library's own upload of each file under a new prefix (returned), as a user without our storage
    would write it; and a delete of such a prefix (not timed)."""
    if kind == "gcs":
        from google.cloud import storage

        bucket = storage.Client(client_options={"api_endpoint": spec["endpoint_url"]},
                                use_auth_w_custom_endpoint=False).bucket(spec["bucket"])

        def gcs(folder: Path, files: list[str]) -> str:
            prefix = f"plain/{uuid.uuid4()}/"
            for name in files:
                bucket.blob(prefix + name).upload_from_filename(str(folder / name))
            return prefix

        return gcs, lambda prefix: bucket.delete_blobs(list(bucket.client.list_blobs(bucket, prefix=prefix)))
    from azure.storage.blob import ContainerClient

    container = ContainerClient.from_connection_string(spec["connection_string"], container_name=spec["container"])

    def azure(folder: Path, files: list[str]) -> str:
        prefix = f"plain/{uuid.uuid4()}/"
        for name in files:
            with open(folder / name, "rb") as f:
                container.upload_blob(prefix + name, f, overwrite=True)
        return prefix

    def remove(prefix: str) -> None:
        container.delete_blobs(*[b.name for b in container.list_blobs(name_starts_with=prefix)])

    return azure, remove


@contextlib.contextmanager
def _server(kind: str) -> Iterator[str]:
    if kind == "gcs":
        script = gcs_emulator_path()
        if script is None:
            raise SystemExit("gcp-storage-emulator is not installed (pip install gcp-storage-emulator)")
        with gcs_emulator(script) as endpoint:
            yield endpoint
        return
    binary = azurite_path()
    if binary is None:
        raise SystemExit("Azurite is not installed: run `make azurite` (or set DET_TEST_AZURITE)")
    with azurite(binary) as connection_string:
        yield connection_string


def bench(kind: str, folder: Path, files: list[str], rounds: int) -> dict[str, float]:
    """Interleaved rounds of both uploads to a fresh bucket on a fresh server; medians."""
    with _server(kind) as server:
        spec = bucket_spec(kind, server, prefix="ours")
        storage = storage_from_spec(spec, default_dir=folder)
        assert isinstance(storage, RemoteStorage)
        ctx = CheckpointContext(dummy_distributed(), storage)
        plain, remove = _plain_upload(kind, spec)
        remove(plain(folder, files[-1:]))  # warm both clients (connections, the bucket check)
        storage.check()
        times: dict[str, list[float]] = {"ours": [], "plain": []}
        ways: list[tuple[str, Callable[[], str]]] = [
            ("ours", lambda: ctx.upload(folder, {"steps_completed": 1})), ("plain", lambda: plain(folder, files))]
        for i in range(rounds):
            for name, upload in ways if i % 2 == 0 else ways[::-1]:  # alternate which goes first
                start = time.perf_counter()
                made = upload()
                times[name].append(time.perf_counter() - start)
                (storage.delete if name == "ours" else remove)(made)  # the servers hold one checkpoint at a time
        assert storage.list_checkpoints() == []
        ratios = [o / p for o, p in zip(times["ours"], times["plain"])]
        ours_s, plain_s = times["ours"], times["plain"]
    return {"ratio": statistics.median(ratios), "ours_s": statistics.median(ours_s),
            "plain_s": statistics.median(plain_s)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of a 4 MB checkpoint (a smoke run)")
    parser.add_argument("--mb", type=int, default=200, help="the checkpoint's size")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (each: both uploads)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.mb = 2, 4
    rounds, mb = args.rounds, args.mb
    with tempfile.TemporaryDirectory(prefix="det-bench-bucket-") as tmp:
        folder = Path(tmp)
        files = _write_checkpoint(folder, mb)
        for kind in ("gcs", "azure"):
            r = bench(kind, folder, files, rounds)
            print(f"upload of a {mb} MB checkpoint to {kind}, {rounds} rounds, medians: ours {r['ours_s']:.2f} s "
                  f"({mb / r['ours_s']:.0f} MB/s), plain client {r['plain_s']:.2f} s "
                  f"({mb / r['plain_s']:.0f} MB/s), ratio ours/plain {r['ratio']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
