"""CheckpointContext.stage: store_path in two steps (write, then publish or abort, possibly on another
thread), as the loop's background checkpoints use it; and DirectoryStorage's one-walk commit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from determined_trials import core
from determined_trials.core.storage import DirectoryStorage
from determined_trials.core.storage._base import list_local_files


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
