"""The host buffers of background checkpoints (``pytorch/checkpoint/_snapshot.py``): allocated on a helper thread
before the first checkpoint, reused by every snapshot, one copy of the state held and released when
``fit`` returns; every background checkpoint equals the model at its step. The ``cuda`` cases (GPU
tier) add pinned buffers, copies queued on a side stream without a host sync, and the pinned last
checkpoint."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from trials_pytorch import ResumeTrial, assert_same_state, config, fit

import determined_trials.pytorch._experimental as experimental
import determined_trials.pytorch.checkpoint._io as checkpoint_io
import determined_trials.pytorch.checkpoint._snapshot as snapshot_module
from determined_trials import pytorch
from determined_trials.loop import _checkpointing
from determined_trials.pytorch import Batch
from determined_trials.pytorch.checkpoint._io import read_state_file, write_trial_state
from determined_trials.pytorch.checkpoint._snapshot import HostBuffers, copy_to_host, host_copy, tree_nbytes

NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CONF = config({"global_batch_size": 4, "lr": 0.01, "hidden": 8})
FIT: dict[str, Any] = {"max_length": Batch(12), "checkpoint_period": Batch(4), "reporting_period": Batch(2)}


@pytest.fixture(autouse=True)
def snapshots_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every state is copied and written in the background, however small (threshold 0)."""
    monkeypatch.setattr(experimental, "SNAPSHOT_MIN_BYTES", 0)


class _AtSaveStart(pytorch.PyTorchCallback):
    """Keeps a copy of the live checkpoint dict at each ``on_checkpoint_save_start`` (the model at that step)."""

    def __init__(self, copies: list[dict[str, Any]]) -> None:
        self.copies = copies

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        self.copies.append({key: host_copy(checkpoint[key]) for key in ("models_state_dict", "optimizers_state_dict")})


class _RecordingTrial(ResumeTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext, device: str, record: bool) -> None:
        self.at_save_start: list[dict[str, Any]] = []
        self.record = record
        super().__init__(context)
        assert context.device.type == device

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"copies": _AtSaveStart(self.at_save_start)} if self.record else {}


def _fit(tmp_path: Path, device: str, record: bool = True) -> tuple[Any, dict[str, Any]]:
    trial, trainer, info = fit(lambda ctx: _RecordingTrial(ctx, device, record), CONF, tmp_path, **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    return trial, info


def _data_ptrs(tree: Any) -> set[int]:
    if isinstance(tree, torch.Tensor):
        return {tree.data_ptr()}
    items = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else ()
    return set().union(*(_data_ptrs(item) for item in items)) if items else set()


class _BufferLog:
    """Records, through the module's own functions, where host buffers were made and which snapshots
    were kept (the training thread's name is the main thread's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.allocated_on: set[str] = set()
        self.allocated: set[int] = set()
        self.kept: list[set[int]] = []
        self.held_before_release: list[int] = []
        allocate, keep, release = snapshot_module._allocate, HostBuffers.keep, HostBuffers.release

        def recording_allocate(spec: Any) -> Any:
            tree = allocate(spec)
            self.allocated_on.add(threading.current_thread().name)
            self.allocated |= _data_ptrs(tree)
            return tree

        def recording_keep(buffers: HostBuffers, tree: Any) -> None:
            self.kept.append(_data_ptrs({k: tree[k] for k in ("models_state_dict", "optimizers_state_dict")}))
            keep(buffers, tree)

        def recording_release(buffers: HostBuffers) -> None:
            self.held_before_release.append(buffers.nbytes())
            release(buffers)
            assert buffers.nbytes() == 0 and not buffers.prepared

        monkeypatch.setattr(snapshot_module, "_allocate", recording_allocate)
        monkeypatch.setattr(HostBuffers, "keep", recording_keep)
        monkeypatch.setattr(HostBuffers, "release", recording_release)


def test_buffers_are_made_off_the_training_thread_before_the_first_checkpoint_and_reused(
    tmp_path: Path, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _BufferLog(monkeypatch)
    trial, info = _fit(tmp_path, device)
    assert [c.steps_completed for c in info["checkpoints"]] == [4, 8, 12]
    assert log.allocated_on == {"det-snapshot-buffers_0"}  # never the training thread
    # two background snapshots (steps 4, 8) copied into the prepared buffers: no model or optimizer
    # tensor of theirs was allocated by the training thread, the second reused the first's
    assert len(log.kept) >= 2
    assert log.kept[0] and log.kept[0] <= log.allocated
    assert log.kept[1] == log.kept[0]
    # one copy of the state held until fit returned, then released
    models_and_optimizers = tree_nbytes({k: trial.at_save_start[0][k] for k in trial.at_save_start[0]})
    assert len(log.held_before_release) == 1
    assert models_and_optimizers <= log.held_before_release[0] < models_and_optimizers + 64 * 1024


def test_every_background_checkpoint_equals_the_model_at_its_step(tmp_path: Path, device: str) -> None:
    trial, info = _fit(tmp_path, device)
    storage = Path(tmp_path, "checkpoints")
    saved = [read_state_file(storage / c.uuid) for c in info["checkpoints"]]
    assert len(saved) == len(trial.at_save_start) == 3
    for step, (state, expected) in enumerate(zip(saved, trial.at_save_start)):
        for key in ("models_state_dict", "optimizers_state_dict"):
            assert_same_state(state[key], expected[key], f"checkpoint {step} {key}")
    # the last one (written at once; from pinned buffers on CUDA) holds the trained model
    assert_same_state(saved[-1]["models_state_dict"][0], host_copy(trial.model.state_dict()))


def test_copies_reuse_buffers_of_the_same_shape_and_dtype_only() -> None:
    state = {"w": torch.arange(6.0).reshape(2, 3), "n": torch.tensor(3), "meta": [1, "a"]}
    first = host_copy(state)
    assert first["w"].data_ptr() != state["w"].data_ptr() and first["meta"] is not state["meta"]
    state["w"].add_(1)
    second = host_copy(state, first)
    assert second["w"].data_ptr() == first["w"].data_ptr() and torch.equal(second["w"], state["w"])
    grown = {"w": torch.zeros(3, 3), "n": torch.tensor(3.0), "meta": [1, "a"]}
    third = host_copy(grown, second)
    assert third["w"].data_ptr() != second["w"].data_ptr() and third["w"].shape == (3, 3)
    assert third["n"].dtype == torch.float32 and third["n"].data_ptr() != second["n"].data_ptr()


def test_prepared_buffers_match_the_template_and_are_released() -> None:
    template = {"models_state_dict": [{"w": torch.ones(128, 64), "steps": torch.tensor(2)}],
                "optimizers_state_dict": [{"state": {0: {"m": torch.ones(128, 64)}}, "param_groups": [{"lr": 0.1}]}]}
    buffers = HostBuffers()
    assert not buffers.prepared and buffers.nbytes() == 0
    buffers.prepare(template, torch.device("cpu"))
    assert buffers.prepared and not buffers.pinned
    tree = buffers.take()
    assert tree["models_state_dict"][0]["w"].shape == (128, 64) and tree["optimizers_state_dict"][0]["param_groups"] == [
        {"lr": None}]
    assert buffers.nbytes() == tree_nbytes(template)
    copied, ready = copy_to_host(template, tree, torch.device("cpu"))
    assert ready is None and copied["models_state_dict"][0]["w"].data_ptr() == tree["models_state_dict"][0]["w"].data_ptr()
    assert copied["optimizers_state_dict"][0]["param_groups"] == [{"lr": 0.1}]
    buffers.release()
    assert buffers.nbytes() == 0 and not buffers.prepared


class _FakeStream:
    """Stands for a CUDA stream and its event on a CPU-only machine: records what is asked of it."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: _FakeStream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")

    def record_event(self) -> Any:
        self.log.append(f"event recorded on {self.name}")
        return self

    def synchronize(self) -> None:
        self.log.append("writer waits for the event")


def test_cuda_copies_are_ordered_between_the_two_streams(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The order ``copy_to_host`` asks of CUDA, with fake streams (the GPU tier runs it for real): the
    side stream waits for the training stream, the copies are queued on it, an event is recorded, the
    training stream waits for the copies; the writer waits for the event before it serialises."""
    log: list[str] = []
    main, side = _FakeStream("training stream", log), _FakeStream("side stream", log)
    in_side = {"on": False}

    class _OnSide:
        def __enter__(self) -> None:
            in_side["on"] = True

        def __exit__(self, *exc: object) -> None:
            in_side["on"] = False

    copy_tensor = snapshot_module._copy_tensor

    def logged_copy(source: torch.Tensor, reuse: Any, async_device: Any) -> torch.Tensor:
        log.append(f"copy {tuple(source.shape)} on the {'side' if in_side['on'] else 'training'} stream")
        return copy_tensor(source, reuse, async_device)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: _OnSide())
    monkeypatch.setattr(snapshot_module, "_side_stream", lambda device: side)
    monkeypatch.setattr(snapshot_module, "_copy_tensor", logged_copy)
    state = {"w": torch.ones(2, 3), "b": torch.zeros(3)}
    copied, ready = copy_to_host(state, None, torch.device("cuda", 0))
    assert log == ["side stream waits for training stream", "copy (2, 3) on the side stream", "copy (3,) on the side stream",
                   "event recorded on side stream", "training stream waits for side stream"]
    saved = torch.save

    def logged_save(obj: Any, path: Any) -> None:
        log.append("torch.save")
        saved(obj, path)

    monkeypatch.setattr(torch, "save", logged_save)
    write_trial_state({"state": copied, "ready": ready, "load_data": "{}"}, tmp_path)
    assert log[-2:] == ["writer waits for the event", "torch.save"]


@pytest.mark.gpu
@NEEDS_CUDA
def test_a_cuda_snapshot_queues_its_copies_without_a_host_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's background checkpoint step (snapshot into pinned buffers, hand-off to the writer) under
    ``torch.cuda.set_sync_debug_mode("error")``: the training thread never waits for the device. (The
    mode is global: the writer, which does wait for the copies, starts once the step is over.)"""
    start, wait_copied = _checkpointing.Checkpointer._start_background_save, checkpoint_io.wait_copied
    steps: list[bool] = []
    step_over = threading.Event()

    def guarded(checkpointer: Any, *args: Any) -> Any:
        step_over.clear()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return start(checkpointer, *args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            steps.append(True)
            step_over.set()

    def writer_wait(ready: Any) -> None:
        assert step_over.wait(timeout=600), "the guarded checkpoint step never ended"
        wait_copied(ready)

    monkeypatch.setattr(_checkpointing.Checkpointer, "_start_background_save", guarded)
    monkeypatch.setattr(checkpoint_io, "wait_copied", writer_wait)
    log = _BufferLog(monkeypatch)
    _, info = _fit(tmp_path, "cuda", record=False)
    assert len(steps) == 2 and len(info["checkpoints"]) == 3
    kept = log.kept[0]
    assert kept and kept <= log.allocated


@pytest.mark.gpu
@NEEDS_CUDA
def test_cuda_buffers_are_pinned() -> None:
    template = {"w": torch.ones(1024, device="cuda"), "step": torch.tensor(1.0)}
    buffers = HostBuffers()
    buffers.prepare(template, torch.device("cuda"))
    tree = buffers.take()
    assert buffers.pinned and tree["w"].is_pinned() and not tree["step"].is_pinned()
    copied, ready = copy_to_host(template, tree, torch.device("cuda"))
    snapshot_module.wait_copied(ready)
    assert torch.equal(copied["w"], torch.ones(1024)) and copied["w"].data_ptr() == tree["w"].data_ptr()
    buffers.release()
