"""CheckpointContext on directory storage: round trips, selectors, metadata rules, sharding, atomicity."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.helpers_ckpt import Recorder, failure, make_tree, read_tree, start_worker

from determined_trials.core import CheckpointContext, DownloadMode
from determined_trials.core._distributed import dummy_distributed
from determined_trials.core.storage import (
    AzureStorage,
    CheckpointNotFoundError,
    DirectoryStorage,
    GCSStorage,
    S3Storage,
    storage_from_spec,
)
from determined_trials.errors import ConfigError
from determined_trials.testing import run_ranks


@pytest.fixture
def storage(tmp_path: Path) -> DirectoryStorage:
    return DirectoryStorage(tmp_path / "ckpts")


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def ctx(storage: DirectoryStorage, recorder: Recorder) -> CheckpointContext:
    return CheckpointContext(dummy_distributed(), storage, recorder=recorder)


def test_upload_download_round_trip_records_resources(
    ctx: CheckpointContext, tmp_path: Path, recorder: Recorder
) -> None:
    files = make_tree(tmp_path / "src")
    sid = ctx.upload(tmp_path / "src", {"steps_completed": 7, "nested": {"a": 1}})
    assert uuid.UUID(sid).version == 4
    ctx.download(sid, tmp_path / "dst")
    assert read_tree(tmp_path / "dst") == {**files, "metadata.json": (tmp_path / "dst/metadata.json").read_bytes()}
    assert ctx.get_metadata(sid) == {"steps_completed": 7, "nested": {"a": 1}}
    (saved_id, metadata, resources), = recorder.saved
    assert saved_id == sid and metadata["steps_completed"] == 7
    assert resources == {**{k: len(v) for k, v in files.items()}, "metadata.json": resources["metadata.json"]}
    assert read_tree(tmp_path / "src") == files  # the source folder is left as it was


def test_store_path_and_restore_path_use_the_stored_folder(ctx: CheckpointContext, storage: DirectoryStorage) -> None:
    with ctx.store_path({"steps_completed": 3}) as (path, sid):
        files = make_tree(path)
        assert not storage.exists(sid) and sid not in storage.list_checkpoints()
    assert storage.list_checkpoints() == [sid]
    with ctx.restore_path(sid) as restored:
        assert restored == storage.path / sid  # direct access: no copy
        tree = read_tree(restored)
    assert json.loads(tree.pop("metadata.json")) == {"steps_completed": 3}
    assert tree == files
    assert [p.name for p in storage.path.iterdir()] == [sid]  # no staging left behind


def test_selectors_filter_upload_and_download(ctx: CheckpointContext, tmp_path: Path) -> None:
    make_tree(tmp_path / "src")
    sid = ctx.upload(tmp_path / "src", {"steps_completed": 1}, selector=lambda p: p.startswith("sub/"))
    assert set(ctx.storage.list_files(sid)) == {"sub/opt.bin", "sub/deep/x.txt", "metadata.json"}
    ctx.download(sid, tmp_path / "dst", selector=lambda p: p.endswith(".txt"))
    assert read_tree(tmp_path / "dst") == {"sub/deep/x.txt": b"x"}
    ctx.download(sid, tmp_path / "dst2", DownloadMode.NoSharedDownload, selector=lambda p: p == "sub/opt.bin")
    assert read_tree(tmp_path / "dst2") == {"sub/opt.bin": b"optimizer"}


@pytest.mark.parametrize(
    "metadata, match",
    [
        (None, "steps_completed"),
        ({}, "no 'steps_completed'"),
        ({"steps_completed": -1}, ">= 0"),
        ({"steps_completed": "3"}, "integer"),
        ({"steps_completed": 1, "obj": object()}, "JSON-serialisable"),
    ],
)
def test_metadata_must_hold_steps_completed(
    ctx: CheckpointContext, storage: DirectoryStorage, tmp_path: Path, metadata: Any, match: str
) -> None:
    (tmp_path / "src").mkdir()
    with pytest.raises(ValueError, match=match):
        ctx.upload(tmp_path / "src", metadata)
    with pytest.raises(ValueError, match=match), ctx.store_path(metadata):
        pytest.fail("the body must not run")
    assert list(storage.path.iterdir()) == []


def test_metadata_none_error_says_how_to_fix(ctx: CheckpointContext) -> None:
    with pytest.raises(ValueError, match=r"metadata=\{'steps_completed'"), ctx.store_path(None):
        pass


def test_numpy_like_scalars_in_metadata_are_converted(ctx: CheckpointContext, tmp_path: Path) -> None:
    class Scalar:
        def item(self) -> int:
            return 5

    sid = ctx.upload(None, {"steps_completed": Scalar(), "loss": Scalar()})
    assert ctx.get_metadata(sid) == {"steps_completed": 5, "loss": 5}


def test_failed_store_path_stores_nothing(ctx: CheckpointContext, storage: DirectoryStorage, recorder: Recorder) -> None:
    with pytest.raises(KeyError), ctx.store_path({"steps_completed": 1}) as (path, _):
        (path / "half.bin").write_bytes(b"123")
        raise KeyError("boom")
    assert list(storage.path.iterdir()) == [] and recorder.saved == []


def test_delete_removes_and_records(ctx: CheckpointContext, storage: DirectoryStorage, recorder: Recorder) -> None:
    sid = ctx.upload(None, {"steps_completed": 1})
    ctx.delete(sid)
    assert recorder.deleted == [sid] and storage.list_checkpoints() == []
    with pytest.raises(CheckpointNotFoundError, match="not found"), ctx.restore_path(sid):
        pass
    with pytest.raises(CheckpointNotFoundError):
        ctx.get_metadata(sid)


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".staging-x"])
def test_bad_storage_ids_are_refused(ctx: CheckpointContext, bad: str) -> None:
    with pytest.raises(ValueError, match="storage id"):
        ctx.get_metadata(bad)


def test_stale_staging_is_invisible_and_can_be_cleaned(ctx: CheckpointContext, storage: DirectoryStorage) -> None:
    stale = storage.path / ".staging-dead" / "rank-0"
    stale.mkdir(parents=True)
    (stale / "x").write_bytes(b"x")
    sid = ctx.upload(None, {"steps_completed": 1})
    assert storage.list_checkpoints() == [sid]
    assert storage.remove_stale_staging(older_than_s=3600) == []
    os.utime(stale / "x", (0, 0))
    os.utime(stale, (0, 0))
    os.utime(stale.parent, (0, 0))
    assert storage.remove_stale_staging(older_than_s=3600) == [".staging-dead"]


# -- several ranks (real processes) ------------------------------------------------------------------
def _rank_refuses_shard_false(dist: Any, root: Path) -> list[tuple[str, str]]:
    if dist.rank == 0:
        return []
    ctx = CheckpointContext(dist, DirectoryStorage(root))
    errors = [failure(lambda: ctx.upload(None, {"steps_completed": 1}))]
    errors.append(failure(lambda: ctx.store_path({"steps_completed": 1}).__enter__()))
    return errors


@pytest.mark.slow
def test_shard_false_on_a_worker_is_refused(storage: DirectoryStorage) -> None:
    _, errors = run_ranks(_rank_refuses_shard_false, 2, args=(storage.path,), timeout=60)
    assert all(kind == "RuntimeError" and "rank 0" in msg and "shard=True" in msg for kind, msg in errors), errors
    assert list(storage.path.iterdir()) == []


def _rank_writes_shard(dist: Any, root: Path) -> tuple[str, list[Any]]:
    recorder = Recorder()
    ctx = CheckpointContext(dist, DirectoryStorage(root), recorder=recorder)
    md = {"steps_completed": 4, f"rank{dist.rank}": dist.rank, "shared": {f"r{dist.rank}": True}}
    with ctx.store_path(md, shard=True) as (path, sid):
        (path / f"part-{dist.rank}.bin").write_bytes(b"%d" % dist.rank)
        if dist.rank == 1:
            (path / "common").mkdir()
            (path / "common" / "cfg.json").write_text("{}")
    return sid, recorder.saved


@pytest.mark.slow
def test_sharded_store_path_is_the_union_with_merged_metadata(storage: DirectoryStorage) -> None:
    results = run_ranks(_rank_writes_shard, 3, args=(storage.path,), timeout=60)
    sid = results[0][0]
    assert {r[0] for r in results} == {sid}
    assert set(storage.list_files(sid)) == {"part-0.bin", "part-1.bin", "part-2.bin", "common/cfg.json", "metadata.json"}
    assert storage.read_metadata(sid) == {
        "steps_completed": 4, "rank0": 0, "rank1": 1, "rank2": 2, "shared": {"r0": True, "r1": True, "r2": True}
    }
    assert [len(r[1]) for r in results] == [1, 0, 0]  # recorded once, by the chief
    assert results[0][1][0][2]["common/cfg.json"] == 2
    assert storage.list_checkpoints() == [sid] and [p.name for p in storage.path.iterdir()] == [sid]


def _rank_uploads_some(dist: Any, root: Path, src: Path) -> str:
    mine = src if dist.rank == 1 else None
    return CheckpointContext(dist, DirectoryStorage(root)).upload(
        mine, {"steps_completed": 2} if dist.rank == 0 else None, shard=True, selector=lambda p: "deep" not in p
    )


@pytest.mark.slow
def test_sharded_upload_with_nothing_on_some_ranks(storage: DirectoryStorage, tmp_path: Path) -> None:
    make_tree(tmp_path / "w1")
    sid, sid1 = run_ranks(_rank_uploads_some, 2, args=(storage.path, tmp_path / "w1"), timeout=60)
    assert sid == sid1 and set(storage.list_files(sid)) == {"model.bin", "sub/opt.bin", "metadata.json"}


def _rank_clashes(dist: Any, root: Path) -> tuple[str, str]:
    def save() -> None:
        with CheckpointContext(dist, DirectoryStorage(root)).store_path({"steps_completed": 1}, shard=True) as (p, _):
            (p / "weights.bin").write_bytes(b"%d" % dist.rank)
            (p / f"own-{dist.rank}").write_bytes(b"")

    return failure(save)


@pytest.mark.slow
def test_sharded_file_clash_fails_on_every_rank(storage: DirectoryStorage) -> None:
    for kind, msg in run_ranks(_rank_clashes, 2, args=(storage.path,), timeout=60):
        assert kind == "RuntimeError" and "'weights.bin' (ranks 0, 1)" in msg, msg
    assert list(storage.path.iterdir()) == []


def _rank_disagrees(dist: Any, root: Path) -> tuple[str, str]:
    ctx = CheckpointContext(dist, DirectoryStorage(root))
    return failure(lambda: ctx.upload(None, {"steps_completed": 1 + dist.rank}, shard=True))


@pytest.mark.slow
def test_sharded_metadata_conflict_fails_on_every_rank(storage: DirectoryStorage) -> None:
    for kind, msg in run_ranks(_rank_disagrees, 2, args=(storage.path,), timeout=60):
        assert kind == "ValueError" and "'steps_completed' differs" in msg, msg
    assert list(storage.path.iterdir()) == []


def _rank_fails_midway(dist: Any, root: Path) -> tuple[str, str]:
    def save() -> None:
        with CheckpointContext(dist, DirectoryStorage(root)).store_path({"steps_completed": 1}, shard=True) as (p, _):
            (p / f"f{dist.rank}").write_bytes(b"x")
            if dist.rank == 1:
                raise OSError("disk full on rank 1")

    return failure(save)


@pytest.mark.slow
def test_sharded_failure_on_one_rank_is_reported_to_the_others(storage: DirectoryStorage) -> None:
    chief, worker = run_ranks(_rank_fails_midway, 2, args=(storage.path,), timeout=60)
    assert worker == ("OSError", "disk full on rank 1")  # the failing rank gets its own error
    assert chief[0] == "RuntimeError" and "rank 1" in chief[1] and "disk full" in chief[1]
    assert list(storage.path.iterdir()) == []


def _rank_downloads(dist: Any, root: Path, sid: str, dst: Path) -> tuple[dict[str, bytes], bool]:
    ctx = CheckpointContext(dist, DirectoryStorage(root))
    ctx.download(sid, dst, selector=lambda p: p == ("model.bin" if dist.rank else "sub/opt.bin"))
    with ctx.restore_path(sid) as path:
        direct = path == root / sid
    return read_tree(dst), direct


@pytest.mark.slow
def test_shared_download_gives_the_folder_the_union_of_the_selectors(
    ctx: CheckpointContext, storage: DirectoryStorage, tmp_path: Path
) -> None:
    make_tree(tmp_path / "src")
    sid = ctx.upload(tmp_path / "src", {"steps_completed": 1})
    first, second = run_ranks(_rank_downloads, 2, args=(storage.path, sid, tmp_path / "shared"), timeout=60)
    assert set(first[0]) == {"model.bin", "sub/opt.bin"} and second == first and first[1]


# -- storage_from_spec --------------------------------------------------------------------------------
def _dir_of(spec: Any, default_dir: Path) -> Path:
    made = storage_from_spec(spec, default_dir=default_dir)
    assert isinstance(made, DirectoryStorage)
    return made.path


def test_storage_from_spec_directories(tmp_path: Path) -> None:
    assert _dir_of(None, tmp_path / "d") == (tmp_path / "d").resolve()
    assert _dir_of(str(tmp_path / "p"), tmp_path) == (tmp_path / "p").resolve()
    assert _dir_of(tmp_path / "q", tmp_path) == (tmp_path / "q").resolve()
    shared = {"type": "shared_fs", "host_path": str(tmp_path), "storage_path": "ck", "save_trial_latest": 2}
    assert _dir_of(shared, tmp_path) == (tmp_path / "ck").resolve()
    assert _dir_of({"type": "directory", "container_path": str(tmp_path / "c")}, tmp_path) == (tmp_path / "c").resolve()

    class Model:
        def model_dump(self) -> dict[str, Any]:
            return {"type": "shared_fs", "host_path": str(tmp_path), "storage_path": None}

    assert _dir_of(Model(), tmp_path) == tmp_path.resolve()
    s3 = storage_from_spec("s3://my-bucket/a/b/", default_dir=tmp_path)
    assert isinstance(s3, S3Storage) and (s3.bucket, s3.prefix) == ("my-bucket", "a/b")
    gcs = storage_from_spec("gs://my_bucket.x/p/", default_dir=tmp_path)
    assert isinstance(gcs, GCSStorage) and (gcs.bucket, gcs.prefix, gcs.describe()) == ("my_bucket.x", "p", "gs://my_bucket.x/p")


def test_az_uri_takes_the_connection_string_from_the_environment(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    with pytest.raises(ConfigError, match="AZURE_STORAGE_CONNECTION_STRING, which is not set"):
        storage_from_spec("az://ckpts/a", default_dir=tmp_path)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=x;AccountKey=a2V5;BlobEndpoint=http://h:1/x")
    az = storage_from_spec("az://ckpts/a/", default_dir=tmp_path)
    assert isinstance(az, AzureStorage) and (az.container, az.prefix) == ("ckpts", "a")
    assert az.describe() == "az://ckpts/a (endpoint http://h:1/x)" and "a2V5" not in repr(az)  # never the key


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"type": "shard_fs", "host_path": "/x"}, "Did you mean 'shared_fs'"),
        ({"host_path": "/x"}, "type: required key is missing"),
        ({"type": "s3", "prefix": "p"}, "bucket: required key is missing"),
        ({"type": "s3", "bucket": "ab"}, "invalid S3 bucket name"),
        ({"type": "s3", "bucket": "abc", "endpoint": "http://x"}, "Did you mean 'endpoint_url'"),
        ({"type": "directory"}, "container_path: required key is missing"),
        ({"type": "shared_fs", "host_path": "/a", "storage_path": "/b"}, "outside host_path"),
        ({"type": "gcs", "prefix": "p"}, "bucket: required key is missing.*bucket: my-checkpoints"),
        ({"type": "gcs", "bucket": "Upper"}, "invalid GCS bucket name"),
        ({"type": "azure", "connection_string": "x"}, "container: required key is missing"),
        ({"type": "azure", "container": "a--b", "connection_string": "x"}, "invalid Azure container name"),
        ({"type": "azure", "container": "abc"}, "exactly one of"),
        ({"type": "azure", "container": "abc", "connection_string": "x", "account_url": "u"}, "exactly one of"),
        ({"type": "azure", "container": "abc", "connection_string": "x", "credential": "k"}, "goes with account_url"),
        ({"type": "gcs", "bucket": "abc", "container": "c"}, r"container: unknown key.*keys allowed here: .*endpoint_url\)"),
        ("hdfs://bucket/x", "not supported"),
        ("s3://", "names no bucket"),
        ("az:///p", "names no container"),
        (42, "expected a directory path"),
        ("", "is blank. Fix: give a directory path"),
        ("  ", "is blank"),
    ],
)
def test_storage_from_spec_errors(tmp_path: Path, spec: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        storage_from_spec(spec, default_dir=tmp_path)


@pytest.mark.parametrize(
    "spec, key",
    [
        ({"type": "azure", "container": "abc"}, "checkpoint_storage"),
        ({"type": "azure", "container": "abc", "account_url": "https://a", "connection_string": "x"},
         "checkpoint_storage"),
        ({"type": "azure", "container": "abc", "connection_string": "x", "credential": "k"},
         "checkpoint_storage.credential"),
        ({"type": "shared_fs", "host_path": "/a", "storage_path": "/b"}, "checkpoint_storage.storage_path"),
        ({"type": "s3", "prefix": "p"}, "checkpoint_storage.bucket"),
        ("hdfs://bucket/x", "checkpoint_storage"),
    ],
)
def test_each_storage_rule_says_one_message_through_every_entry_point(tmp_path: Path, spec: Any, key: str) -> None:
    """core.init(checkpoint_storage=...), core.init(config=...), load_config, create_experiment and
    storage_from_spec: the same problem line, from the one rule in the config's storage section."""
    from determined_trials import core
    from determined_trials.config import load_config
    from determined_trials.experiment import create_experiment

    config = {"entrypoint": "python3 train.py", "checkpoint_storage": spec,
              "searcher": {"name": "single", "metric": "loss", "max_length": 1}}
    (tmp_path / "ctx").mkdir()

    def problem(call: Any) -> str:
        with pytest.raises(ConfigError) as caught:
            call()
        lines = [line for line in str(caught.value).splitlines() if line.startswith(f"  - {key}: ")]
        assert len(lines) == 1, caught.value
        return lines[0]

    said = {
        problem(lambda: storage_from_spec(spec, default_dir=tmp_path)),
        problem(lambda: core.init(checkpoint_storage=spec, run_dir=tmp_path / "a")),
        problem(lambda: core.init(config=config, run_dir=tmp_path / "b")),
        problem(lambda: load_config(config)),
        problem(lambda: create_experiment(config, tmp_path / "ctx", run_dir=tmp_path / "c")),
    }
    assert len(said) == 1, said


def test_a_storage_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        storage_from_spec(str(tmp_path / "f"), default_dir=tmp_path)


# -- atomicity under SIGKILL ----------------------------------------------------------------------------
@pytest.mark.slow
def test_a_kill_mid_write_leaves_earlier_checkpoints_intact(tmp_path: Path) -> None:
    store = tmp_path / "ckpts"
    with start_worker(str(store), "store_path") as (proc, next_line):
        first = json.loads(next_line())
        second = json.loads(next_line())["second"]
        assert next_line() == "writing"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    storage = DirectoryStorage(store)
    ctx = CheckpointContext(dummy_distributed(), storage)
    assert storage.list_checkpoints() == [first["first"]]
    with ctx.restore_path(first["first"]) as path:
        assert hashlib.sha256((path / "model.bin").read_bytes()).hexdigest() == first["model"]
        assert hashlib.sha256((path / "sub/opt.bin").read_bytes()).hexdigest() == first["opt"]
    assert not storage.exists(second)
    with pytest.raises(CheckpointNotFoundError, match="incomplete"), ctx.restore_path(second):
        pass
    with pytest.raises(CheckpointNotFoundError):
        ctx.get_metadata(second)
    assert (store / f".staging-{second}").exists()  # the partial write is there, hidden
    assert storage.remove_stale_staging(older_than_s=-1) == [f".staging-{second}"]
    assert storage.list_checkpoints() == [first["first"]]


@pytest.mark.parametrize(("uri", "extra"), [("gs://abc/p", "gcs"), ("az://abc/p", "azure")])
def test_a_missing_client_library_names_the_extra(tmp_path: Path, monkeypatch: Any, uri: str, extra: str) -> None:
    import importlib.util

    from determined_trials.core.storage import StorageError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith(
        ("google.cloud", "azure")) else real(name, *a))
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "UseDevelopmentStorage=true")
    with pytest.raises(StorageError, match=rf"pip install 'determined-trials\[{extra}\]'"):
        storage_from_spec(uri, default_dir=tmp_path)
