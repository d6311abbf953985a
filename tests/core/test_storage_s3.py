"""S3 checkpoint storage against a moto S3 server on 127.0.0.1: round trips, selectors, incomplete writes."""

from __future__ import annotations

import hashlib
import json
import signal
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers_ckpt import Recorder, failure, make_tree, read_tree, start_worker

from determined_trials.core import CheckpointContext, DownloadMode
from determined_trials.core._distributed import dummy_distributed
from determined_trials.core.storage import (
    CheckpointNotFoundError,
    S3Storage,
    StorageError,
    storage_from_spec,
)
from determined_trials.testing import run_ranks

pytest.importorskip("moto")
KEYS = {"access_key": "testing", "secret_key": "testing", "region": "us-east-1"}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def spec(endpoint: str) -> dict[str, Any]:
    """A fresh bucket per test, as a checkpoint_storage dict."""
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    client = S3Storage(bucket, endpoint_url=endpoint, **KEYS)._make_client()
    client.create_bucket(Bucket=bucket)
    return {"type": "s3", "bucket": bucket, "prefix": "runs/exp1", "endpoint_url": endpoint, **KEYS}


@pytest.fixture
def storage(spec: dict[str, Any], tmp_path: Path) -> S3Storage:
    made = storage_from_spec(spec, default_dir=tmp_path)
    assert isinstance(made, S3Storage)
    return made


def keys(storage: S3Storage) -> list[str]:
    return sorted(o["Key"] for o in storage._iter_objects(""))


def test_store_path_restore_path_round_trip(storage: S3Storage) -> None:
    recorder = Recorder()
    ctx = CheckpointContext(dummy_distributed(), storage, recorder=recorder)
    with ctx.store_path({"steps_completed": 9}) as (path, sid):
        files = make_tree(path)
        staging = path
    assert not staging.exists()  # the local staging copy is gone once uploaded
    assert keys(storage) == sorted(f"runs/exp1/{sid}/{rel}" for rel in [*files, "metadata.json"])
    assert storage.list_checkpoints() == [sid]
    with ctx.restore_path(sid) as restored:
        tree = read_tree(restored)
    assert not restored.exists()  # the download was temporary
    assert json.loads(tree.pop("metadata.json")) == {"steps_completed": 9} == ctx.get_metadata(sid)
    assert tree == files
    assert recorder.saved[0][2] == {**{k: len(v) for k, v in files.items()}, "metadata.json": recorder.saved[0][2]["metadata.json"]}


def test_upload_download_with_selectors_and_delete(storage: S3Storage, tmp_path: Path) -> None:
    recorder = Recorder()
    ctx = CheckpointContext(dummy_distributed(), storage, recorder=recorder)
    make_tree(tmp_path / "src")
    sid = ctx.upload(tmp_path / "src", {"steps_completed": 2}, selector=lambda p: p != "model.bin")
    assert set(storage.list_files(sid)) == {"sub/opt.bin", "sub/deep/x.txt", "metadata.json"}
    ctx.download(sid, tmp_path / "dst", selector=lambda p: p.startswith("sub/"))
    assert read_tree(tmp_path / "dst") == {"sub/opt.bin": b"optimizer", "sub/deep/x.txt": b"x"}
    with ctx.restore_path(sid, DownloadMode.NoSharedDownload, selector=lambda p: p.endswith(".txt")) as path:
        assert read_tree(path) == {"sub/deep/x.txt": b"x"}
    ctx.delete(sid)
    assert keys(storage) == [] and recorder.deleted == [sid]
    with pytest.raises(CheckpointNotFoundError):
        ctx.get_metadata(sid)


def test_an_incomplete_prefix_is_invisible(storage: S3Storage, tmp_path: Path) -> None:
    ctx = CheckpointContext(dummy_distributed(), storage)
    good = ctx.upload(None, {"steps_completed": 1})
    partial = str(uuid.uuid4())
    (tmp_path / "w.bin").write_bytes(b"half")
    storage.put(partial, 0, tmp_path, ["w.bin"])  # staged, never committed: like a writer killed here
    assert storage.list_checkpoints() == [good] and not storage.exists(partial)
    with pytest.raises(CheckpointNotFoundError, match="incomplete"), ctx.restore_path(partial):
        pass
    with pytest.raises(CheckpointNotFoundError):
        ctx.download(partial, tmp_path / "d")
    with pytest.raises(CheckpointNotFoundError):
        ctx.get_metadata(partial)
    ctx.delete(partial)  # a partial checkpoint can still be cleaned up
    assert keys(storage) == [f"runs/exp1/{good}/metadata.json"]


def test_a_failed_upload_removes_what_it_wrote(storage: S3Storage, tmp_path: Path, monkeypatch: Any) -> None:
    original = storage.put

    def put_then_fail(storage_id: str, rank: int, src: Path, files: list[str]) -> None:
        original(storage_id, rank, src, files[:1])
        raise OSError("network went away")

    monkeypatch.setattr(storage, "put", put_then_fail)
    make_tree(tmp_path / "src")
    with pytest.raises(OSError, match="network"):
        CheckpointContext(dummy_distributed(), storage).upload(tmp_path / "src", {"steps_completed": 1})
    assert keys(storage) == []


def test_uri_spec_with_endpoint_from_environment(spec: dict[str, Any], tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", spec["endpoint_url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    storage = storage_from_spec(f"s3://{spec['bucket']}/by/uri/", default_dir=tmp_path)
    assert isinstance(storage, S3Storage) and storage.prefix == "by/uri"
    sid = CheckpointContext(dummy_distributed(), storage).upload(None, {"steps_completed": 3})
    assert keys(storage) == [f"by/uri/{sid}/metadata.json"]


def test_a_missing_bucket_is_a_clear_error(endpoint: str) -> None:
    storage = S3Storage("no-such-bucket-here", endpoint_url=endpoint, **KEYS)
    with pytest.raises(StorageError, match="'no-such-bucket-here' does not exist"):
        storage.list_checkpoints()


def _rank_restores(dist: Any, spec: dict[str, Any], sid: str) -> tuple[str, dict[str, bytes], int]:
    storage = storage_from_spec(spec, default_dir=Path("unused"))
    calls = []
    original = storage.download_files

    def counted(storage_id: str, dst: Path, files: Sequence[str]) -> None:
        calls.append(list(files))
        original(storage_id, dst, files)

    storage.download_files = counted  # type: ignore[method-assign]
    ctx = CheckpointContext(dist, storage)
    with ctx.restore_path(sid, selector=lambda p: p == ("model.bin" if dist.local_rank else "sub/opt.bin")) as path:
        tree = read_tree(path)
    return str(path), tree, len(calls)


@pytest.mark.slow
def test_shared_restore_downloads_once_per_machine(storage: S3Storage, spec: dict[str, Any], tmp_path: Path) -> None:
    make_tree(tmp_path / "src")
    sid = CheckpointContext(dummy_distributed(), storage).upload(tmp_path / "src", {"steps_completed": 1})
    results = run_ranks(_rank_restores, 4, local_size=2, args=(spec, sid), timeout=60)
    assert [r[2] for r in results] == [1, 0, 1, 0]  # only local rank 0 of each pretend machine downloads
    assert results[0][0] == results[1][0] != results[2][0] == results[3][0]
    assert all(set(tree) == {"model.bin", "sub/opt.bin"} for _, tree, _ in results)  # the union of selectors
    assert not any(Path(p).exists() for p, _, _ in results)  # the temporary copies are gone


def _rank_restores_missing(dist: Any, spec: dict[str, Any]) -> tuple[str, str]:
    ctx = CheckpointContext(dist, storage_from_spec(spec, default_dir=Path("unused")))
    return failure(lambda: ctx.restore_path(str(uuid.uuid4())).__enter__())


@pytest.mark.slow
def test_shared_restore_of_a_missing_checkpoint_fails_on_every_rank(spec: dict[str, Any]) -> None:
    for kind, msg in run_ranks(_rank_restores_missing, 2, args=(spec,), timeout=60):
        assert kind == "CheckpointNotFoundError" and "not found" in msg


def _rank_shards_to_s3(dist: Any, spec: dict[str, Any]) -> str:
    ctx = CheckpointContext(dist, storage_from_spec(spec, default_dir=Path("unused")))
    with ctx.store_path({"steps_completed": 5}, shard=True) as (path, sid):
        (path / f"shard-{dist.rank}.bin").write_bytes(b"%d" % dist.rank)
    return sid


@pytest.mark.slow
def test_sharded_store_path_to_s3(storage: S3Storage, spec: dict[str, Any]) -> None:
    sid, sid1 = run_ranks(_rank_shards_to_s3, 2, args=(spec,), timeout=60)
    assert sid == sid1 and set(storage.list_files(sid)) == {"shard-0.bin", "shard-1.bin", "metadata.json"}


@pytest.mark.slow
def test_a_kill_mid_upload_leaves_the_partial_checkpoint_invisible(spec: dict[str, Any], tmp_path: Path) -> None:
    with start_worker(json.dumps(spec), "upload") as (proc, next_line):
        first = json.loads(next_line())
        assert next_line() == "writing"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    storage = storage_from_spec(spec, default_dir=tmp_path)
    assert isinstance(storage, S3Storage)
    assert storage.list_checkpoints() == [first["first"]]
    partial = {k.split("/")[2] for k in keys(storage)} - {first["first"]}
    assert len(partial) == 1  # some files of the second checkpoint were uploaded...
    with pytest.raises(CheckpointNotFoundError), CheckpointContext(dummy_distributed(), storage).restore_path(partial.pop()):
        pass  # ...but without metadata.json it does not exist
    with CheckpointContext(dummy_distributed(), storage).restore_path(first["first"]) as path:
        assert hashlib.sha256((path / "model.bin").read_bytes()).hexdigest() == first["model"]
        assert hashlib.sha256((path / "sub/opt.bin").read_bytes()).hexdigest() == first["opt"]
