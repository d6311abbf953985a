"""Asynchronous checkpoints of Trainer.fit, both ways: a copied state serialised off the training thread
("copy"), and a small state serialised at once with only the publish off it ("write-now"). Exact resume,
hook order, writer errors, a stop while a write is in flight; crash recovery of the commit order
(pending rows, staging clean-up) with kill -9 of real processes; fsync of every file; GC of a plain
script's fit (completed or stopped; a preempted one keeps all)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from support.helpers_paths import SUPPORT
from trials_pytorch import ResumeTrial, assert_same_state, config, fit, state_snapshot

import determined_trials.pytorch._adapter as adapter_module
import determined_trials.pytorch._experimental as experimental
import determined_trials.pytorch.checkpoint._io as checkpoint_io
from determined_trials import core, pytorch
from determined_trials.core.storage import DirectoryStorage
from determined_trials.core.store._checkpoint_recovery import recover_checkpoints
from determined_trials.loop import SaveMode
from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)

KILL_WORKER = SUPPORT / "worker_async_ckpt_kill.py"
CONF = config({"global_batch_size": 4, "lr": 0.01, "workers": 0, "hidden": 8})
FIT: dict[str, Any] = {"max_length": Batch(12), "checkpoint_period": Batch(4), "reporting_period": Batch(2)}


class Uploads(pytorch.PyTorchCallback):
    """Records save_start / upload_end with the thread they ran on (no write_end: async stays on)."""

    def __init__(self, trial: Any, events: list[tuple[str, Any, str]]) -> None:
        self.trial, self.events = trial, events

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        self.events.append(("save_start", len(self.trial.seen), threading.current_thread().name))

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        self.events.append(("upload_end", uuid, threading.current_thread().name))


class HookedTrial(ResumeTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self.events: list[tuple[str, Any, str]] = []

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"uploads": Uploads(self, self.events)}


BACKGROUND = ["copy", "write-now"]


@pytest.fixture(params=BACKGROUND)
def background(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with each background way: "copy" (threshold 0) or "write-now" (the default for
    these small states)."""
    if request.param == "copy":
        monkeypatch.setattr(experimental, "SNAPSHOT_MIN_BYTES", 0)
    else:
        assert experimental.SNAPSHOT_MIN_BYTES > 10_000  # the test trial's state is far smaller
    return str(request.param)


def patch_background_step(monkeypatch: pytest.MonkeyPatch, mode: str, wrapper: Any) -> None:
    """Wrap the step that runs on the writer thread: serialising the copy ("copy"), or publishing
    ("write-now"); ``wrapper(original, *args)`` runs instead."""
    if mode == "copy":
        original = adapter_module.write_trial_state
        monkeypatch.setattr(adapter_module, "write_trial_state", lambda *a: wrapper(original, *a))
    else:
        commit = DirectoryStorage.commit
        monkeypatch.setattr(DirectoryStorage, "commit", lambda self, *a: wrapper(commit, self, *a))


def test_async_checkpoints_are_written_in_the_background_and_resume_bitwise(
    tmp_path: Path, background: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    serialised, background_steps = [], []
    write = checkpoint_io.write_trial_state

    def recording_write(snapshot: dict[str, Any], path: Path) -> None:
        serialised.append(threading.current_thread().name)
        write(snapshot, path)

    monkeypatch.setattr(checkpoint_io, "write_trial_state", recording_write)
    monkeypatch.setattr(adapter_module, "write_trial_state", recording_write)
    patch_background_step(monkeypatch, background, lambda original, *a: (
        background_steps.append(threading.current_thread().name), original(*a))[1])
    straight, _, _ = fit(ResumeTrial, CONF, tmp_path / "straight", **FIT)
    serialised.clear()
    background_steps.clear()
    first, trainer, info = fit(lambda c: ResumeTrial(c, stop_after=5), CONF, tmp_path / "resumed", **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "stopped"
    assert [c.steps_completed for c in info["checkpoints"]] == [4, 6]
    # batch 4's checkpoint went to the writer; the stop's (the last of the run) was written at once
    assert background_steps[0].startswith("det-checkpoint-writer")
    main = threading.main_thread().name
    assert serialised == (["det-checkpoint-writer_0", main] if background == "copy" else [main, main])
    second, trainer, _ = fit(ResumeTrial, CONF, tmp_path / "resumed", latest_checkpoint=info["checkpoints"][-1].uuid,
                             **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    assert first.seen + second.seen == straight.seen
    assert_same_state(state_snapshot(second), state_snapshot(straight))


def test_hooks_fire_once_per_checkpoint_in_order_on_the_training_thread(tmp_path: Path, background: str) -> None:
    trial, _, info = fit(HookedTrial, CONF, tmp_path, **FIT)
    uuids = [c.uuid for c in info["checkpoints"]]
    assert [c.steps_completed for c in info["checkpoints"]] == [4, 8, 12]
    kinds = [e[0] for e in trial.events]
    assert kinds == ["save_start", "upload_end"] * 3  # each upload ends before the next save starts
    assert [e[1] for e in trial.events if e[0] == "upload_end"] == uuids
    assert [e[1] for e in trial.events if e[0] == "save_start"] == [4, 8, 12]
    assert {e[2] for e in trial.events} == {threading.main_thread().name}


def test_a_writer_error_surfaces_in_the_training_process(
    tmp_path: Path, background: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def failing(original: Any, *args: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full (injected)")
        return original(*args)

    patch_background_step(monkeypatch, background, failing)
    with pytest.raises(OSError, match="disk full"):
        fit(ResumeTrial, CONF, tmp_path, **FIT)
    store = core.LocalStore(tmp_path)
    assert [c.steps_completed for c in store.checkpoints()] == [4]
    assert store.pending_checkpoints(1) == []
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".staging-")]


def test_a_stop_while_a_write_is_in_flight_waits_for_it(
    tmp_path: Path, background: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()

    def held(original: Any, *args: Any) -> Any:
        if not release.is_set():
            entered.set()
            assert release.wait(120), "the training thread never released the write"
        return original(*args)

    class StopDuringWrite(HookedTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            loss = super().train_batch(batch, epoch_idx, batch_idx)
            if batch_idx == 5:  # the write of batch 4's checkpoint is held on the writer thread
                assert entered.wait(120), "the background write of batch 4 never started"
                assert not any(e[0] == "upload_end" for e in self.events)
                self.context.set_stop_requested(True)
                release.set()
            return loss

    patch_background_step(monkeypatch, background, held)
    trial, trainer, info = fit(StopDuringWrite, CONF, tmp_path, **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "stopped"
    assert [c.steps_completed for c in info["checkpoints"]] == [4, 6]
    assert [e[1] for e in trial.events if e[0] == "upload_end"] == [c.uuid for c in info["checkpoints"]]


def test_the_background_way_follows_the_state_size(tmp_path: Path) -> None:
    with pytorch.init(exp_conf=CONF, run_dir=tmp_path) as context:
        trial = ResumeTrial(context)
        adapter = adapter_module.PyTorchAdapter(trial, context, pytorch_hooks({}))
        size = checkpoint_io.state_nbytes(context)
        params = sum(p.numel() * p.element_size() for p in trial.model.parameters())
        assert size >= params > 0
        assert not adapter.wants_snapshot()  # far below the default 4 MiB: serialised at once
        context.experimental.set_checkpoint_snapshot_threshold(size)
        assert adapter.wants_snapshot()
        context.experimental.set_checkpoint_snapshot_threshold(size + 1)
        assert not adapter.wants_snapshot()
        context.experimental.set_checkpoint_snapshot_threshold(0)
        assert adapter.wants_snapshot()
        with pytest.raises(ValueError, match="min_bytes must be an int >= 0"):
            context.experimental.set_checkpoint_snapshot_threshold(-1)


def test_async_is_off_for_write_end_callbacks_sharded_savers_and_when_disabled(tmp_path: Path) -> None:
    class WriteEnd(pytorch.PyTorchCallback):
        def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
            pass

    with pytorch.init(exp_conf=CONF, run_dir=tmp_path) as context:
        trial = ResumeTrial(context)
        adapter = adapter_module.PyTorchAdapter(trial, context, pytorch_hooks({"plain": Uploads(trial, [])}))
        assert adapter.save_mode is SaveMode.ASYNC_SNAPSHOT
        adapter._hooks = pytorch_hooks({"w": WriteEnd()})
        assert adapter.save_mode is SaveMode.SYNC_CHIEF
        adapter._hooks = pytorch_hooks({})
        adapter._sharded = True  # an FSDP2 model's: every rank writes its shard, in the background
        assert adapter.save_mode is SaveMode.ASYNC_SHARDED
        context.experimental.disable_async_checkpoints()
        assert adapter.save_mode is SaveMode.SHARDED
        adapter._sharded = False
        assert adapter.save_mode is SaveMode.SYNC_CHIEF


def pytorch_hooks(callbacks: dict[str, Any]) -> Any:
    from determined_trials.loop import HookRunner

    return HookRunner(callbacks)


# -- crash recovery: kill -9 of a real process ---------------------------------------------------


def _run_until(run_dir: Path, mode: str, marker: str, background: str) -> int:
    """Start the kill worker, wait for ``marker`` on its stdout, SIGKILL it; return its trial id."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    err_path = run_dir / "worker.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, str(KILL_WORKER), str(run_dir), mode, background], stdout=subprocess.PIPE,
                                stderr=err, text=True, env=env)
    timer = threading.Timer(240, proc.kill)  # a hung worker fails the test instead of hanging it
    timer.start()
    try:
        assert proc.stdout is not None
        trial_id, lines = None, []
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("{"):
                trial_id = json.loads(line)["trial_id"]
            if marker in line:  # the writer thread's marker may share a line with a training summary
                break
        if not lines or marker not in lines[-1]:
            proc.wait(60)
            raise AssertionError(f"worker ended before {marker!r}: {lines}\n{err_path.read_text()[-6000:]}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
    assert trial_id is not None
    return int(trial_id)


@pytest.mark.slow
@pytest.mark.parametrize("background", BACKGROUND)
def test_a_kill_during_a_background_write_leaves_the_previous_checkpoint_latest(tmp_path: Path, background: str) -> None:
    trial_id = _run_until(tmp_path, "write", "writing", background)
    store, storage = core.LocalStore(tmp_path), DirectoryStorage(tmp_path / "checkpoints")
    latest = store.latest_checkpoint(trial_id)
    assert latest is not None and latest.steps_completed == 2
    pending = store.pending_checkpoints(trial_id)
    assert len(pending) == 1 and not storage.exists(pending[0])
    assert (tmp_path / "checkpoints" / f".staging-{pending[0]}").exists()
    assert recover_checkpoints(store, storage, trial_id) == ([], pending)
    assert not (tmp_path / "checkpoints" / f".staging-{pending[0]}").exists()
    assert store.pending_checkpoints(trial_id) == [] and store.latest_checkpoint(trial_id) == latest
    _, trainer, _ = fit(ResumeTrial, CONF, tmp_path, latest_checkpoint=latest.uuid, max_length=Batch(4))
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"


@pytest.mark.slow
@pytest.mark.parametrize("background", BACKGROUND)
def test_a_kill_between_publish_and_record_is_recovered_at_start(tmp_path: Path, background: str) -> None:
    trial_id = _run_until(tmp_path, "record", "published", background)
    store, storage = core.LocalStore(tmp_path), DirectoryStorage(tmp_path / "checkpoints")
    (published,) = store.pending_checkpoints(trial_id)
    assert storage.exists(published) and storage.read_metadata(published)["steps_completed"] == 4
    assert store.latest_checkpoint(trial_id).steps_completed == 2  # type: ignore[union-attr]
    # what core.init does on the trial's next start (and the runner before it picks the latest)
    assert recover_checkpoints(store, storage, trial_id) == ([published], [])
    latest = store.latest_checkpoint(trial_id)
    assert latest is not None and latest.uuid == published and latest.steps_completed == 4
    assert "state_dict.pth" in latest.resources


# -- start-up clean-up, durability, GC -----------------------------------------------------------


def test_core_init_removes_stale_staging_but_not_fresh(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    stale, fresh = ckpts / ".staging-old" / "rank-0", ckpts / ".staging-new" / "rank-0"
    for folder in (stale, fresh):
        folder.mkdir(parents=True)
        (folder / "state_dict.pth").write_bytes(b"x" * 100)
    old = 1_000_000.0
    for path in (stale / "state_dict.pth", stale, stale.parent):
        os.utime(path, (old, old))
    with core.init(run_dir=tmp_path):
        pass
    assert not stale.parent.exists() and fresh.exists()


@pytest.mark.parametrize("thread", ["main", "writer"])  # concurrent fsyncs on the main thread, one by one elsewhere
def test_every_checkpoint_file_is_fsynced_before_it_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, thread: str
) -> None:
    synced: list[str] = []
    fsync, rename = os.fsync, os.rename
    published: list[list[str]] = []

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    def recording_rename(src: Any, dst: Any) -> None:
        published.append(list(synced))
        rename(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "rename", recording_rename)
    storage = DirectoryStorage(tmp_path)
    ctx = core.CheckpointContext(core.DistributedContext(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0,
                                                         cross_size=1), storage)
    staged = ctx.stage({"steps_completed": 1})
    storage_id = staged.storage_id
    (staged.path / "sub").mkdir()
    (staged.path / "state_dict.pth").write_bytes(b"weights")
    (staged.path / "sub" / "extra.bin").write_bytes(b"more")
    if thread == "main":
        staged.publish()
    else:
        writer = threading.Thread(target=staged.publish)
        writer.start()
        writer.join(60)
    before = {Path(p).name for p in published[0]}
    assert {"state_dict.pth", "extra.bin", "metadata.json", "sub", "rank-0"} <= before
    assert storage.exists(storage_id)


def test_a_completed_plain_fit_keeps_what_the_runner_would(tmp_path: Path) -> None:
    conf = {**CONF, "checkpoint_storage": {"type": "shared_fs", "host_path": str(tmp_path / "ckpts"),
                                           "save_trial_best": 1, "save_trial_latest": 1}}
    _, _, info = fit(ResumeTrial, conf, tmp_path, max_length=Batch(12), checkpoint_period=Batch(2),
                     validation_period=Batch(2), checkpoint_policy="all")
    store = core.LocalStore(tmp_path)
    kept = store.checkpoints(trial_id=info["trial_id"])
    deleted = [c for c in store.checkpoints(trial_id=info["trial_id"], include_deleted=True) if c.state == "DELETED"]
    assert 1 <= len(kept) <= 2 and kept[-1].steps_completed == 12
    assert len(kept) + len(deleted) == 6
    on_disk = {p.name for p in (tmp_path / "ckpts").iterdir() if not p.name.startswith(".")}
    assert on_disk == {c.uuid for c in kept}


class PreemptedTrial(ResumeTrial):
    """Preempted (as by SIGTERM) on batch ``preempt_at``."""

    def __init__(self, context: pytorch.PyTorchTrialContext, preempt_at: int) -> None:
        super().__init__(context)
        self.preempt_at = preempt_at

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        if batch_idx == self.preempt_at:
            assert self.context._core is not None
            self.context._core.preempt.request_preemption()
        return super().train_batch(batch, epoch_idx, batch_idx)


@pytest.mark.parametrize("ending", ["stopped", "preempted"])
def test_a_plain_fit_the_trial_stops_keeps_what_the_runner_would_and_a_preempted_one_keeps_all(
    tmp_path: Path, ending: str
) -> None:
    conf = {**CONF, "checkpoint_storage": {"type": "shared_fs", "host_path": str(tmp_path / "ckpts"),
                                           "save_trial_best": 0, "save_trial_latest": 1}}
    trial_factory = ((lambda c: ResumeTrial(c, stop_after=9)) if ending == "stopped"
                     else (lambda c: PreemptedTrial(c, preempt_at=9)))
    _, trainer, info = fit(trial_factory, conf, tmp_path, max_length=Batch(40), checkpoint_period=Batch(2),
                           validation_period=Batch(2), checkpoint_policy="all")
    assert trainer.exit_reason is not None and trainer.exit_reason.value == ending
    store = core.LocalStore(tmp_path)
    kept = store.checkpoints(trial_id=info["trial_id"])
    everything = store.checkpoints(trial_id=info["trial_id"], include_deleted=True)
    assert [c.steps_completed for c in everything] == [2, 4, 6, 8, 10]
    # stopped: the trial ended, so only its latest stays; preempted: it resumes, so nothing is collected
    assert [c.steps_completed for c in kept] == ([10] if ending == "stopped" else [2, 4, 6, 8, 10])
    on_disk = {p.name for p in (tmp_path / "ckpts").iterdir() if not p.name.startswith(".")}
    assert on_disk == {c.uuid for c in kept}


def test_snapshot_is_a_copy_training_may_mutate(tmp_path: Path) -> None:
    with pytorch.init(exp_conf=CONF, run_dir=tmp_path) as context:
        trial = ResumeTrial(context)
        adapter = adapter_module.PyTorchAdapter(trial, context, pytorch_hooks({}))
        snap = adapter.snapshot()
        weight = snap["state"]["models_state_dict"][0]["0.weight"]
        before = weight.clone()
        with torch.no_grad():
            for p in trial.model.parameters():
                p.add_(1.0)
        assert torch.equal(weight, before)
        assert hasattr(snap["state"]["models_state_dict"][0], "_metadata")
