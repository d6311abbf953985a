"""Checkpoints of ``torch.compile``d models hold the user model's plain keys (no ``_orig_mod.``): they
load into the uncompiled model and resume into a compiled one bitwise, and checkpoints written before
(with ``_orig_mod.`` keys) still load. The quick tests compile with the ``eager`` backend (the real
``torch.compile`` wrapper, no code generation); one test uses the default backend (inductor)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trials_pytorch import ResumeTrial, assert_same_state, config, fit, state_snapshot

from determined_trials import pytorch
from determined_trials.pytorch import Batch
from determined_trials.pytorch.checkpoint import _io as io
from determined_trials.pytorch.parallel._ddp import COMPILED_PREFIX, plain_module, plain_state_dict

pytestmark = pytest.mark.usefixtures("cpu_device")  # inductor's CPU code; the GPU tier compiles on CUDA

FIT: dict[str, Any] = {"max_length": Batch(10), "validation_period": Batch(5)}
CONF = config({"global_batch_size": 4, "lr": 0.01, "hidden": 8})
STOP_AFTER = 3


def _run(run_dir: Path, backend: str | None, stop_after: int | None = None,
         checkpoint: str | None = None) -> tuple[ResumeTrial, Path | None]:
    trial, _, info = fit(lambda ctx: ResumeTrial(ctx, stop_after=stop_after, compile_backend=backend), CONF, run_dir,
                         latest_checkpoint=checkpoint, **FIT)
    folder = run_dir / "checkpoints" / info["checkpoints"][-1].uuid if info["checkpoints"] else None
    return trial, folder


def _model_keys(folder: Path) -> list[str]:
    return list(torch.load(folder / io.STATE_FILE, weights_only=True)["models_state_dict"][0])


def test_plain_module_unwraps_compile_and_ddp_wrappers() -> None:
    model = torch.nn.Linear(2, 1)
    compiled = torch.compile(model, backend="eager")
    assert plain_module(compiled) is model
    assert plain_module(model) is model
    assert list(compiled.state_dict()) == [COMPILED_PREFIX + "weight", COMPILED_PREFIX + "bias"]
    dist = torch.distributed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(compiled)  # wrap_model(torch.compile(model)) with DDP
        assert plain_module(ddp) is model
        assert plain_module(torch.compile(ddp, backend="eager")) is model
    finally:
        dist.destroy_process_group()


def test_plain_state_dict_strips_the_prefix_only_where_it_is_a_compile_wrappers() -> None:
    model = torch.nn.Linear(2, 1)
    old = torch.compile(model, backend="eager").state_dict()
    assert list(plain_state_dict(old, model)) == ["weight", "bias"]
    assert getattr(plain_state_dict(old, model), "_metadata", None) is not None
    twice = {COMPILED_PREFIX + key: value for key, value in old.items()}
    assert list(plain_state_dict(twice, model)) == ["weight", "bias"]
    plain = model.state_dict()
    assert plain_state_dict(plain, model) is plain

    class Holder(torch.nn.Module):  # a user's module whose child is named _orig_mod: keys kept
        def __init__(self) -> None:
            super().__init__()
            self._orig_mod = torch.nn.Linear(2, 1)

    holder = Holder()
    assert list(plain_state_dict(holder.state_dict(), holder)) == [COMPILED_PREFIX + "weight", COMPILED_PREFIX + "bias"]


@pytest.mark.parametrize(("first", "then"), [("eager", "eager"), ("eager", None), (None, "eager")])
def test_compiled_and_plain_models_resume_each_others_checkpoints_bitwise(
    tmp_path: Path, first: str | None, then: str | None,
) -> None:
    ref, _ = _run(tmp_path / "ref", None)
    stopped, folder = _run(tmp_path / "run", first, stop_after=STOP_AFTER)
    assert folder is not None
    assert _model_keys(folder) == ["0.weight", "0.bias", "3.weight", "3.bias"]
    second, _ = _run(tmp_path / "run", then, checkpoint=folder.name)
    assert stopped.seen + second.seen == ref.seen
    assert_same_state(state_snapshot(second), state_snapshot(ref))


def _as_written_before_plain_keys(folder: Path) -> None:
    """The checkpoint as a compiled model's was written before: its model keys under ``_orig_mod.``."""
    state = torch.load(folder / io.STATE_FILE, weights_only=True)
    state["models_state_dict"] = [{COMPILED_PREFIX + key: value for key, value in model.items()}
                                  for model in state["models_state_dict"]]
    torch.save(state, folder / io.STATE_FILE)


@pytest.mark.parametrize("then", [None, "eager"])
def test_checkpoints_with_compiled_wrapper_keys_still_resume(tmp_path: Path, then: str | None) -> None:
    ref, _ = _run(tmp_path / "ref", None)
    stopped, folder = _run(tmp_path / "run", "eager", stop_after=STOP_AFTER)
    assert folder is not None
    _as_written_before_plain_keys(folder)
    second, _ = _run(tmp_path / "run", then, checkpoint=folder.name)
    assert stopped.seen + second.seen == ref.seen
    assert_same_state(state_snapshot(second), state_snapshot(ref))


def test_load_trial_from_a_compiled_models_checkpoint_into_the_plain_model(tmp_path: Path) -> None:
    trained, folder = _run(tmp_path / "run", "eager")
    assert folder is not None
    for old in (False, True):
        if old:
            _as_written_before_plain_keys(folder)
        loaded = pytorch.load_trial_from_checkpoint_path(folder, trial_class=ResumeTrial)
        assert not hasattr(loaded.model, "_orig_mod")
        assert_same_state(loaded.model.state_dict(), state_snapshot(trained)["model"])


@pytest.mark.usefixtures("fresh_dynamo")
def test_inductor_compiled_model_resumes_bitwise(tmp_path: Path) -> None:
    """torch.compile's default backend on this CPU (code generation: about 10 s): a compiled run stopped
    and resumed compiled equals an uninterrupted compiled run, and its checkpoint has plain keys."""
    ref, _ = _run(tmp_path / "ref", "inductor")
    stopped, folder = _run(tmp_path / "run", "inductor", stop_after=STOP_AFTER)
    assert folder is not None
    assert not any(key.startswith(COMPILED_PREFIX) for key in _model_keys(folder))
    second, _ = _run(tmp_path / "run", "inductor", checkpoint=folder.name)
    assert stopped.seen + second.seen == ref.seen
    assert_same_state(state_snapshot(second), state_snapshot(ref))
