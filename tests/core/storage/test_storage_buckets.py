"""Checkpoint storage in buckets, against real servers on 127.0.0.1 (moto's S3, the GCS emulator, Azurite),
each test run on every backend: round trips, selectors, incomplete writes invisible, a kill mid-upload,
sharded uploads from 2 ranks, the URI forms and the errors at start (missing bucket, refused
credentials, an endpoint nobody answers)."""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import signal
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.helpers_buckets import (  # noqa: F401 (the *_server fixtures)
    BUCKETS,
    azure_connection_string,
    azure_server_fixture,
    bucket_server,
    bucket_spec,
    free_port,
    gcs_server_fixture,
    list_keys,
    s3_server_fixture,
)
from support.helpers_ckpt import Recorder, failure, make_tree, read_tree, start_worker

import determined_trials.core.storage._azure as azure_backend
import determined_trials.core.storage._gcs as gcs_backend
from determined_trials import core
from determined_trials.core import CheckpointContext, DownloadMode
from determined_trials.core._distributed import dummy_distributed
from determined_trials.core.storage import (
    CheckpointNotFoundError,
    RemoteStorage,
    StorageError,
    storage_from_spec,
)
from determined_trials.experiment import ExperimentError, create_experiment
from determined_trials.testing import run_ranks


@pytest.fixture(params=BUCKETS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def server(request: pytest.FixtureRequest, kind: str) -> str:
    return bucket_server(request, kind)


@pytest.fixture
def spec(kind: str, server: str) -> dict[str, Any]:
    """A fresh bucket (container) per test, as a checkpoint_storage mapping."""
    return bucket_spec(kind, server)


@pytest.fixture
def storage(spec: dict[str, Any], tmp_path: Path) -> RemoteStorage:
    made = storage_from_spec(spec, default_dir=tmp_path)
    assert isinstance(made, RemoteStorage)
    return made


def test_store_path_restore_path_round_trip(storage: RemoteStorage) -> None:
    recorder = Recorder()
    ctx = CheckpointContext(dummy_distributed(), storage, recorder=recorder)
    with ctx.store_path({"steps_completed": 9}) as (path, sid):
        files = make_tree(path)
        staging = path
    assert not staging.exists()  # the local staging copy is gone once uploaded
    assert list_keys(storage) == sorted(f"runs/exp1/{sid}/{rel}" for rel in [*files, "metadata.json"])
    assert storage.list_checkpoints() == [sid]
    with ctx.restore_path(sid) as restored:
        tree = read_tree(restored)
    assert not restored.exists()  # the download was temporary
    assert json.loads(tree.pop("metadata.json")) == {"steps_completed": 9} == ctx.get_metadata(sid)
    assert tree == files
    assert recorder.saved[0][2] == {**{k: len(v) for k, v in files.items()}, "metadata.json": recorder.saved[0][2]["metadata.json"]}


def test_a_storage_in_use_pickles_and_works_in_the_copy(storage: RemoteStorage) -> None:
    sid = CheckpointContext(dummy_distributed(), storage).upload(None, {"steps_completed": 4})
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.describe() == storage.describe() and copy.read_metadata(sid) == {"steps_completed": 4}


def test_upload_download_with_selectors_and_delete(storage: RemoteStorage, tmp_path: Path) -> None:
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
    assert list_keys(storage) == [] and recorder.deleted == [sid]
    with pytest.raises(CheckpointNotFoundError):
        ctx.get_metadata(sid)


def test_a_file_past_the_multipart_threshold_round_trips(storage: RemoteStorage, tmp_path: Path) -> None:
    """9 MiB: boto3 uploads it in parts, google-cloud-storage as a resumable upload (both switch at 8 MiB)."""
    data = random.Random(3).randbytes(9 << 20)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.bin").write_bytes(data)
    ctx = CheckpointContext(dummy_distributed(), storage)
    sid = ctx.upload(tmp_path / "src", {"steps_completed": 1})
    assert storage.list_files(sid)["big.bin"] == len(data)
    with ctx.restore_path(sid) as path:
        assert (path / "big.bin").read_bytes() == data


def test_an_incomplete_prefix_is_invisible(storage: RemoteStorage, tmp_path: Path) -> None:
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
    assert list_keys(storage) == [f"runs/exp1/{good}/metadata.json"]


def test_a_failed_upload_removes_what_it_wrote(storage: RemoteStorage, tmp_path: Path, monkeypatch: Any) -> None:
    original = storage.put

    def put_then_fail(storage_id: str, rank: int, src: Path, files: list[str]) -> None:
        original(storage_id, rank, src, files[:1])
        raise OSError("network went away")

    monkeypatch.setattr(storage, "put", put_then_fail)
    make_tree(tmp_path / "src")
    with pytest.raises(OSError, match="network"):
        CheckpointContext(dummy_distributed(), storage).upload(tmp_path / "src", {"steps_completed": 1})
    assert list_keys(storage) == []


def test_uri_spec_with_the_client_librarys_own_environment(
    kind: str, spec: dict[str, Any], tmp_path: Path, monkeypatch: Any
) -> None:
    """s3:// with AWS_ENDPOINT_URL and keys, gs:// with STORAGE_EMULATOR_HOST, az:// with
    AZURE_STORAGE_CONNECTION_STRING: the variables each client library reads itself."""
    if kind == "s3":
        for var, value in {"AWS_ENDPOINT_URL": spec["endpoint_url"], "AWS_ACCESS_KEY_ID": "testing",
                           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(var, value)
        uri = f"s3://{spec['bucket']}/by/uri/"
    elif kind == "gcs":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", spec["endpoint_url"])
        uri = f"gs://{spec['bucket']}/by/uri/"
    else:
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", spec["connection_string"])
        uri = f"az://{spec['container']}/by/uri/"
    storage = storage_from_spec(uri, default_dir=tmp_path)
    assert isinstance(storage, RemoteStorage) and storage.prefix == "by/uri"
    sid = CheckpointContext(dummy_distributed(), storage).upload(None, {"steps_completed": 3})
    assert list_keys(storage) == [f"by/uri/{sid}/metadata.json"]


def test_a_missing_bucket_is_a_clear_error_at_init(kind: str, spec: dict[str, Any], tmp_path: Path) -> None:
    missing = {**spec, "bucket" if "bucket" in spec else "container": "no-such-bucket-here"}
    word = "container" if kind == "azure" else "bucket"
    with pytest.raises(StorageError, match=f"{word} 'no-such-bucket-here' does not exist.*create it"):
        core.init(checkpoint_storage=missing, run_dir=tmp_path)
    assert not (tmp_path / "store.sqlite").exists() or core.LocalStore(tmp_path).experiments() == []


def test_experiment_create_refuses_a_missing_bucket_before_recording_anything(
    kind: str, spec: dict[str, Any], tmp_path: Path
) -> None:
    missing = {**spec, "bucket" if "bucket" in spec else "container": "no-such-bucket-here"}
    config = {"entrypoint": "python3 train.py", "checkpoint_storage": missing,
              "searcher": {"name": "single", "metric": "loss", "max_length": 1}}
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "train.py").write_text("raise SystemExit('never runs')\n")
    with pytest.raises(ExperimentError, match="'no-such-bucket-here' does not exist"):
        create_experiment(config, tmp_path / "ctx", run_dir=tmp_path / "runs")
    assert core.LocalStore(tmp_path / "runs").experiments() == []


def test_refused_credentials_are_a_clear_error(kind: str, server: str, tmp_path: Path, monkeypatch: Any) -> None:
    if kind == "s3":
        pytest.skip("moto accepts any S3 keys")
    if kind == "azure":
        spec = bucket_spec(kind, server)
        wrong = azure_connection_string(int(server.rsplit(":", 1)[1].split("/")[0]), "d3Jvbmc=" * 11)
        storage = storage_from_spec({**spec, "connection_string": wrong}, default_dir=tmp_path)
        match = f"Azure refused checking the bucket on container {spec['container']!r}.*check the account key"
    else:  # Application Default Credentials that do not load (no emulator in play)
        bad = tmp_path / "key.json"
        bad.write_text('{"type": "service_account", "project_id": "p"}')
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(bad))
        monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
        storage = storage_from_spec("gs://some-bucket/p", default_dir=tmp_path)
        match = "no usable Google credentials for GCS bucket 'some-bucket'.*GOOGLE_APPLICATION_CREDENTIALS"
    with pytest.raises(StorageError, match=match):
        storage.check()


def test_an_unreachable_endpoint_is_a_clear_error(kind: str, tmp_path: Path, monkeypatch: Any) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # a port nothing listens on
    monkeypatch.setattr(gcs_backend, "_CHECK_TIMEOUT_S", 1.0)
    monkeypatch.setattr(azure_backend, "_CONNECT_RETRIES", 0)
    spec: dict[str, Any] = {
        "s3": {"type": "s3", "bucket": "far-away", "endpoint_url": nobody, "access_key": "a", "secret_key": "b",
               "region": "us-east-1"},
        "gcs": {"type": "gcs", "bucket": "far-away", "endpoint_url": nobody},
        "azure": {"type": "azure", "container": "far-away",
                  "connection_string": azure_connection_string(int(nobody.rsplit(":", 1)[1]))},
    }[kind]
    storage = storage_from_spec(spec, default_dir=tmp_path)
    with pytest.raises(StorageError, match=r"cannot reach the .* of (bucket|container) 'far-away'.*check"):
        storage.check()


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
@pytest.mark.parametrize("kind", ["s3"], indirect=True)  # CheckpointContext's logic: one backend shows it
def test_shared_restore_downloads_once_per_machine(storage: RemoteStorage, spec: dict[str, Any], tmp_path: Path) -> None:
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
@pytest.mark.parametrize("kind", ["s3"], indirect=True)
def test_shared_restore_of_a_missing_checkpoint_fails_on_every_rank(spec: dict[str, Any]) -> None:
    for kind, msg in run_ranks(_rank_restores_missing, 2, args=(spec,), timeout=60):
        assert kind == "CheckpointNotFoundError" and "not found" in msg


def _rank_shards(dist: Any, spec: dict[str, Any]) -> str:
    ctx = CheckpointContext(dist, storage_from_spec(spec, default_dir=Path("unused")))
    with ctx.store_path({"steps_completed": 5}, shard=True) as (path, sid):
        (path / f"shard-{dist.rank}.bin").write_bytes(b"%d" % dist.rank)
    return sid


@pytest.mark.slow
def test_sharded_store_path_each_rank_uploads_its_own_files(storage: RemoteStorage, spec: dict[str, Any]) -> None:
    sid, sid1 = run_ranks(_rank_shards, 2, args=(spec,), timeout=60)
    assert sid == sid1 and set(storage.list_files(sid)) == {"shard-0.bin", "shard-1.bin", "metadata.json"}


@pytest.mark.slow
def test_a_kill_mid_upload_leaves_the_partial_checkpoint_invisible(
    storage: RemoteStorage, spec: dict[str, Any], tmp_path: Path
) -> None:
    with start_worker(json.dumps(spec), "upload") as (proc, next_line):
        first = json.loads(next_line())
        assert next_line() == "writing"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    assert storage.list_checkpoints() == [first["first"]]
    partial = {k.split("/")[2] for k in list_keys(storage)} - {first["first"]}
    assert len(partial) == 1  # some files of the second checkpoint were uploaded...
    with pytest.raises(CheckpointNotFoundError), CheckpointContext(dummy_distributed(), storage).restore_path(partial.pop()):
        pass  # ...but without metadata.json it does not exist
    with CheckpointContext(dummy_distributed(), storage).restore_path(first["first"]) as path:
        assert hashlib.sha256((path / "model.bin").read_bytes()).hexdigest() == first["model"]
        assert hashlib.sha256((path / "sub/opt.bin").read_bytes()).hexdigest() == first["opt"]
