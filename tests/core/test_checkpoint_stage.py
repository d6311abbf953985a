"""CheckpointContext.stage: store_path in two steps (write, then publish or abort, possibly on another
thread), as the loop's background checkpoints use it; DirectoryStorage's one-walk commit; and any start
settling the pending checkpoints of every dead run of the folder."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from determined_trials import core
from determined_trials.core.storage import DirectoryStorage
from determined_trials.core.storage._base import list_local_files
from determined_trials.core.store._owner import claim_experiment


def _context(tmp_path: Path) -> tuple[core.Context, DirectoryStorage]:
    context = core.init(run_dir=tmp_path)
    storage = context.checkpoint.storage
    assert isinstance(storage, DirectoryStorage)
    return context, storage


def test_a_staged_checkpoint_is_invisible_until_published_from_another_thread(tmp_path: Path) -> None:
    context, storage = _context(tmp_path)
    with context:
        trial_id = context.info.trial.trial_id
        staged = context.checkpoint.stage({"steps_completed": 3})
        (staged.path / "sub").mkdir()
        (staged.path / "state.bin").write_bytes(b"w" * 10)
        (staged.path / "sub" / "extra.txt").write_text("x")
        assert not storage.exists(staged.storage_id)
        assert context.store.checkpoints(trial_id=trial_id) == []
        assert context.store.pending_checkpoints(trial_id) == [staged.storage_id]
        published: list[str] = []
        writer = threading.Thread(target=lambda: published.append(staged.publish()))
        writer.start()
        writer.join(60)
        assert published == [staged.storage_id] and storage.exists(staged.storage_id)
        (record,) = context.store.checkpoints(trial_id=trial_id)
        assert record.uuid == staged.storage_id and record.steps_completed == 3
        files = list_local_files(storage.path / staged.storage_id)
        assert record.resources == files  # the commit's one walk lists what is on disk
        assert set(files) == {"metadata.json", "state.bin", "sub/extra.txt"}
        assert context.store.pending_checkpoints(trial_id) == []
        assert not [p for p in storage.path.iterdir() if p.name.startswith(".staging-")]


def test_an_aborted_stage_leaves_nothing(tmp_path: Path) -> None:
    context, storage = _context(tmp_path)
    with context:
        trial_id = context.info.trial.trial_id
        staged = context.checkpoint.stage({"steps_completed": 1})
        (staged.path / "state.bin").write_bytes(b"w")
        staged.abort()
        assert context.store.pending_checkpoints(trial_id) == []
        assert context.store.checkpoints(trial_id=trial_id) == []
        assert list(storage.path.iterdir()) == []


def test_stage_checks_the_metadata_and_the_rank(tmp_path: Path) -> None:
    context, _ = _context(tmp_path)
    with context:
        with pytest.raises(ValueError, match="steps_completed"):
            context.checkpoint.stage({"step": 1})


def test_a_metadata_file_written_into_store_path_is_replaced(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    context, storage = _context(tmp_path)
    with context:
        with context.checkpoint.store_path({"steps_completed": 2}) as (path, storage_id):
            (path / "metadata.json").write_text('{"mine": true}')
            (path / "weights").write_bytes(b"w")
        assert storage.read_metadata(storage_id)["steps_completed"] == 2
        assert "replaced by the checkpoint's own metadata" in caplog.text


def _published_but_unrecorded(store: core.LocalStore, storage: DirectoryStorage, trial_id: int, steps: int) -> str:
    """What a process killed between publishing a checkpoint folder and recording it leaves: a complete
    folder and a PENDING row."""
    dist = core.DistributedContext(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)
    staged = core.CheckpointContext(dist, storage).stage({"steps_completed": steps})  # no recorder: no row
    (staged.path / "state.bin").write_bytes(b"w")
    uuid = staged.publish()
    store.add_checkpoint(uuid=uuid, trial_id=trial_id, steps_completed=steps, metadata={}, resources={},
                         storage=str(storage), pending=True)
    return uuid


def test_any_start_settles_the_pending_checkpoints_of_every_dead_run_of_the_folder(tmp_path: Path) -> None:
    trials: dict[str, tuple[int, int]] = {}
    for name in ("killed", "running", "later"):
        with core.init(config={"name": name, "searcher": {"name": "single", "metric": "m"}}, run_dir=tmp_path) as c:
            trials[name] = (c.info.trial.experiment_id, c.info.trial.trial_id)
            storage = c.checkpoint.storage
    assert isinstance(storage, DirectoryStorage)
    store = core.LocalStore(tmp_path)
    for name in ("killed", "running"):  # both ACTIVE: one's owner is gone (kill -9), one's is alive (us)
        store.set_experiment_state(trials[name][0], "ACTIVE")
    store.set_experiment_owner(trials["killed"][0], os.getpid(), 0.0)  # not this process: another start time
    claim_experiment(store, trials["running"][0])
    killed, running, later = (trials[n][1] for n in ("killed", "running", "later"))
    published = _published_but_unrecorded(store, storage, killed, 4)
    store.add_checkpoint(uuid="never-published", trial_id=killed, steps_completed=6, metadata={}, resources={},
                         storage=str(storage), pending=True)
    ended = _published_but_unrecorded(store, storage, later, 2)  # an ended run's (its experiment COMPLETED)
    in_flight = _published_but_unrecorded(store, storage, running, 8)  # its live writer will record it
    with core.init(config={"name": "next", "searcher": {"name": "single", "metric": "m"}}, run_dir=tmp_path):
        pass  # another experiment's trial starts on the run folder
    assert store.pending_checkpoints(killed) == [] and store.pending_checkpoints(later) == []
    assert [c.uuid for c in store.checkpoints(trial_id=killed)] == [published]  # listed (and kept) now
    assert [c.uuid for c in store.checkpoints(trial_id=later)] == [ended]
    assert store.pending_checkpoints(running) == [in_flight] and storage.exists(in_flight)
