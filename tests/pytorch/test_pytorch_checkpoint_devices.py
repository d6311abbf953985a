"""Checkpoints and devices, proven on the CPU: the state file is read into host memory whatever the
model's device (RNG states must stay there), a checkpoint written on a GPU resumes on a CPU-only
machine bitwise, and CUDA RNG states are restored on every device when the counts match; each rank resumes
with its own RNG states when the checkpoint holds every rank's (written by as many ranks), else the chief's."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.serialization
from trials_pytorch import ResumeTrial, assert_same_state, config, fit, state_snapshot

from determined_trials.pytorch import Batch
from determined_trials.pytorch._adapter import PyTorchAdapter
from determined_trials.pytorch.checkpoint import _io as io

pytestmark = pytest.mark.usefixtures("cpu_device")  # the runs train on the CPU; the GPU tier has their CUDA twins

FIT: dict[str, Any] = {"max_length": Batch(10), "validation_period": Batch(5)}
CONF = config({"global_batch_size": 4, "lr": 0.01, "hidden": 8})
STOP_AFTER = 3  # mid-epoch (6 batches per epoch)


def _reference(run_dir: Path) -> dict[str, Any]:
    trial, _, _ = fit(ResumeTrial, CONF, run_dir, **FIT)
    return {"seen": trial.seen, "state": state_snapshot(trial)}


def _stopped_checkpoint(run_dir: Path) -> Path:
    _, trainer, info = fit(lambda ctx: ResumeTrial(ctx, stop_after=STOP_AFTER), CONF, run_dir, **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "stopped"
    return run_dir / "checkpoints" / info["checkpoints"][-1].uuid


def _resume(run_dir: Path, folder: Path) -> ResumeTrial:
    trial, trainer, _ = fit(ResumeTrial, CONF, run_dir, latest_checkpoint=folder.name, **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    return trial


def test_resume_reads_host_state_to_the_cpu_when_the_model_is_on_another_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The context says its device is cuda:0 while the checkpoint loads (the models stay on the CPU,
    as they would on a GPU stay on it): a load that maps the file to the context's device fails here
    (no CUDA to deserialise onto) and on a GPU (RNG states on cuda:0 have no ``.numpy()``)."""
    ref = _reference(tmp_path / "ref")
    folder = _stopped_checkpoint(tmp_path / "run")
    real_load, places = PyTorchAdapter.load, []
    real_torch_load = torch.load

    def load_on_cuda_context(self: PyTorchAdapter, path: Path) -> None:
        device = self._context._device
        self._context._device = torch.device("cuda", 0)
        try:
            real_load(self, path)
        finally:
            self._context._device = device

    def recording_torch_load(*args: Any, **kwargs: Any) -> Any:
        places.append(kwargs.get("map_location"))
        return real_torch_load(*args, **kwargs)

    monkeypatch.setattr(PyTorchAdapter, "load", load_on_cuda_context)
    monkeypatch.setattr(torch, "load", recording_torch_load)
    second = _resume(tmp_path / "run", folder)
    assert places == ["cpu"]
    assert second.seen == ref["seen"][STOP_AFTER + 1:]
    assert_same_state(state_snapshot(second), ref["state"])


def _as_if_written_on_a_gpu(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewrite the checkpoint's state file as a one-GPU machine writes it: every storage tagged
    ``cuda:0`` and one CUDA RNG state (a CUDA generator's 16 bytes: seed and offset)."""
    state = torch.load(folder / io.STATE_FILE, weights_only=True)
    state["rng_state"]["gpu_rng_states"] = [torch.arange(16, dtype=torch.uint8)]
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(state, folder / io.STATE_FILE)
    with pytest.raises(RuntimeError, match="CUDA"):  # the rewrite worked: a plain load wants a GPU
        torch.load(folder / io.STATE_FILE, weights_only=True)


def test_a_checkpoint_written_on_a_gpu_resumes_bitwise_on_a_cpu_only_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only machine, whatever this one has
    ref = _reference(tmp_path / "ref")
    folder = _stopped_checkpoint(tmp_path / "run")
    _as_if_written_on_a_gpu(folder, monkeypatch)
    second = _resume(tmp_path / "run", folder)
    assert second.seen == ref["seen"][STOP_AFTER + 1:]
    assert_same_state(state_snapshot(second), ref["state"])


def test_load_trial_from_a_gpu_checkpoint_on_a_cpu_only_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from determined_trials import pytorch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    folder = _stopped_checkpoint(tmp_path / "run")
    saved = torch.load(folder / io.STATE_FILE, weights_only=True)["models_state_dict"][0]
    _as_if_written_on_a_gpu(folder, monkeypatch)
    loaded = pytorch.load_trial_from_checkpoint_path(folder, trial_class=ResumeTrial)
    assert loaded.context.device == torch.device("cpu")
    assert_same_state(loaded.model.state_dict(), saved)


# -- RNG states ------------------------------------------------------------------------------------


class _FakeCuda:
    """``torch.cuda`` RNG calls of a machine with ``count`` GPUs, recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
        self.calls: list[tuple[str, Any]] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.full((16,), i, dtype=torch.uint8)
                                                                        for i in range(count)])
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: self.calls.append(("all", list(states))))
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: self.calls.append((device, state)))


def _states(count: int) -> list[torch.Tensor]:
    return [torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(count)]


def test_cuda_rng_states_are_restored_on_every_device_when_the_counts_match(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = _FakeCuda(monkeypatch, 2)
    state = io.capture_rng()
    assert len(state["gpu_rng_states"]) == 2
    state["gpu_rng_states"] = _states(2)
    io.restore_rng(state)
    assert len(cuda.calls) == 1 and cuda.calls[0][0] == "all"
    assert_same_state(cuda.calls[0][1], _states(2))


@pytest.mark.parametrize(("saved", "here"), [(3, 2), (1, 2)])
def test_cuda_rng_states_of_another_gpu_count_restore_the_devices_both_have(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, saved: int, here: int,
) -> None:
    cuda = _FakeCuda(monkeypatch, here)
    state = io.capture_rng()
    state["gpu_rng_states"] = _states(saved)
    with caplog.at_level(logging.WARNING, logger="determined_trials.pytorch"):
        io.restore_rng(state)
    both = min(saved, here)
    assert [device for device, _ in cuda.calls] == list(range(both))
    assert_same_state([rng for _, rng in cuda.calls], _states(saved)[:both])
    assert f"CUDA RNG states of {saved} device(s) but this machine has {here}" in caplog.text


def test_cuda_rng_states_are_skipped_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = _FakeCuda(monkeypatch, 0)
    state = io.capture_rng()
    assert "gpu_rng_states" not in state
    state["gpu_rng_states"] = _states(1)
    io.restore_rng(state)
    assert cuda.calls == []


def test_restore_rng_reads_states_that_are_not_on_the_host() -> None:
    """States handed over on another device (a hook's or an older loader's) are copied to the host
    first: here a tensor subclass whose ``.numpy()`` and ``.tolist()`` fail as a CUDA tensor's do."""
    state = io.capture_rng()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    io.restore_rng(_on_fake_device(state))
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


def test_each_rank_resumes_with_its_own_rng_state_when_the_world_size_matches() -> None:
    chief, other = io.capture_rng(), (torch.rand(1), io.capture_rng())[1]
    checkpoint = {"rng_state": chief, "rank_rng_states": [chief, other]}
    assert io.own_rng_state(checkpoint, 1, 2) is other
    assert io.own_rng_state(checkpoint, 0, 2) is chief
    assert io.own_rng_state(checkpoint, 1, 3) is chief  # written by 2 ranks, resumed on 3: the chief's
    assert io.own_rng_state({"rng_state": chief}, 1, 2) is chief  # one process (or an older checkpoint)


class _Remote(torch.Tensor):
    """A tensor that says it lives on a GPU: no ``.numpy()`` or ``.tolist()`` until ``.cpu()``."""

    @property  # type: ignore[override]
    def device(self) -> torch.device:
        return torch.device("cuda", 0)

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() first.")

    def tolist(self) -> Any:
        raise TypeError("a test's stand-in for a CUDA tensor: copy it to the host first")

    def cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.as_subclass(torch.Tensor).clone()


def _on_fake_device(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.as_subclass(_Remote)
    if isinstance(value, dict):
        return {key: _on_fake_device(item) for key, item in value.items()}
    return value
