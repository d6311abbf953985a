"""Trainer.fit with its checkpoints in a bucket, on each backend against a real server on 127.0.0.1 (moto's S3,
the GCS emulator, Azurite): uploaded off the training thread, resumed bitwise from the bucket, exported with
`det-trials checkpoint export` and loaded with load_trial_from_checkpoint_path, and collected by retention
from the bucket itself."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from support.helpers_buckets import (  # noqa: F401 (the *_server fixtures)
    BUCKETS,
    azure_server_fixture,
    bucket_server,
    bucket_spec,
    gcs_server_fixture,
    s3_server_fixture,
)
from trials_pytorch import ResumeTrial, assert_same_state, config, fit, state_snapshot

import determined_trials.pytorch._experimental as experimental
from determined_trials import core, pytorch
from determined_trials.cli.main import main as cli_main
from determined_trials.core.storage import RemoteStorage, storage_from_spec
from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")  # exact values on the CPU

CONF = config({"global_batch_size": 4, "lr": 0.01, "workers": 0, "hidden": 8})
FIT: dict[str, Any] = {"max_length": Batch(12), "checkpoint_period": Batch(4), "reporting_period": Batch(2),
                       "validation_period": Batch(4), "checkpoint_policy": "all"}


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[Any]]:
    """The uninterrupted run, checkpoints in the run folder: its final state and the batches it saw."""
    trial, _, _ = fit(ResumeTrial, CONF, tmp_path_factory.mktemp("straight"), **FIT)
    return state_snapshot(trial), trial.seen


@pytest.mark.parametrize("kind", BUCKETS)
def test_fit_uploads_in_the_background_resumes_from_the_bucket_exports_and_collects(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    straight: tuple[dict[str, Any], list[Any]],
) -> None:
    spec = {**bucket_spec(kind, bucket_server(request, kind)), "save_trial_best": 0, "save_trial_latest": 1}
    conf = {**CONF, "checkpoint_storage": spec}
    storage = storage_from_spec(spec, default_dir=tmp_path)
    monkeypatch.setattr(experimental, "SNAPSHOT_MIN_BYTES", 0)  # copy the state, serialise and upload it off-thread
    commits: list[str] = []
    commit = RemoteStorage.commit
    monkeypatch.setattr(RemoteStorage, "commit", lambda self, *a: (
        commits.append(threading.current_thread().name), commit(self, *a))[1])

    first, trainer, info = fit(lambda c: ResumeTrial(c, stop_after=5), conf, tmp_path, **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "stopped"
    everything = core.LocalStore(tmp_path).checkpoints(trial_id=info["trial_id"], include_deleted=True)
    assert [c.steps_completed for c in everything] == [4, 6]
    # batch 4's upload ran on the writer thread; the stop's (nothing trains after it) at once
    assert commits[0].startswith("det-checkpoint-writer") and commits[1] == threading.main_thread().name
    # retention after a stopped plain fit (save_trial_latest 1) deleted batch 4's from the bucket
    assert storage.list_checkpoints() == [everything[1].uuid] == [c.uuid for c in info["checkpoints"]]

    second, trainer, info = fit(ResumeTrial, conf, tmp_path, latest_checkpoint=everything[1].uuid, **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    assert first.seen + second.seen == straight[1]  # no batch twice, none skipped
    assert_same_state(state_snapshot(second), straight[0])
    (last,) = info["checkpoints"]
    assert storage.list_checkpoints() == [last.uuid] and last.steps_completed == 12
    assert not any((tmp_path / "checkpoints").glob("*/metadata.json"))  # nothing kept in the run folder

    export = tmp_path / "export"
    assert cli_main(["--run-dir", str(tmp_path), "checkpoint", "export", last.uuid, str(export)]) == 0
    assert sorted(p.relative_to(export).as_posix() for p in export.rglob("*") if p.is_file()) == sorted(
        storage.list_files(last.uuid))
    loaded = pytorch.load_trial_from_checkpoint_path(export, ResumeTrial)
    assert_same_state(loaded.model.state_dict(), straight[0]["model"])
