"""Issue 8, item 11: Determined 0.38 checkpoints (state_dict.pth with pickled RNG state, code/,
load_data.json) load for inference and as a warm start, only behind an explicit opt-in to unpickling."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support.helpers_det038_checkpoint import FULL_038_CONFIG, TRIAL_SPEC, tiny_model, write_038_checkpoint
from trials_pytorch import config, fit

from determined_trials import pytorch
from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)

OPT_IN = {"weights_only": False}


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    inner = module.module if hasattr(module, "module") else module
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}


def _assert_same(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key


def test_a_038_checkpoint_is_refused_without_the_opt_in(tmp_path: Path) -> None:
    folder = write_038_checkpoint(tmp_path / "ckpt", tiny_model(), experiment_config=FULL_038_CONFIG, hparams={"lr": 0.05})
    with pytest.raises(pickle.UnpicklingError, match=r"torch_load_kwargs=\{'weights_only': False\}"):
        pytorch.load_trial_from_checkpoint_path(folder)


def test_a_038_checkpoint_loads_for_inference_with_the_opt_in(tmp_path: Path) -> None:
    model = tiny_model()
    folder = write_038_checkpoint(tmp_path / "ckpt", model, experiment_config=FULL_038_CONFIG, hparams={"lr": 0.05})
    trial: Any = pytorch.load_trial_from_checkpoint_path(folder, torch_load_kwargs=OPT_IN)
    assert type(trial).__module__ == TRIAL_SPEC.split(":")[0] and type(trial).__name__ == "TinyRegression"
    assert TRIAL_SPEC.split(":")[0] not in sys.modules  # imported from code/ and not left behind
    _assert_same(_weights(trial.model), _weights(model))
    assert trial.context.get_experiment_config()["name"] == "tiny-038"  # the recorded 0.38 config parsed
    x = torch.randn(2, 3)
    assert torch.equal(trial.model(x), model(x))


def test_a_038_checkpoint_without_exp_conf_keeps_its_hparams(tmp_path: Path) -> None:
    """0.38 writes experiment_config null when init() got no exp_conf; hparams may still be there."""
    folder = write_038_checkpoint(tmp_path / "ckpt", tiny_model(), experiment_config=None, hparams={"lr": 0.25})
    trial: Any = pytorch.load_trial_from_checkpoint_path(folder, torch_load_kwargs=OPT_IN)
    assert trial.context.get_hparam("lr") == 0.25


def test_bad_torch_load_kwargs_are_named(tmp_path: Path) -> None:
    folder = write_038_checkpoint(tmp_path / "ckpt", tiny_model(), experiment_config=None, hparams={"lr": 0.1})
    with pytest.raises(TypeError, match="only map_location and weights_only"):
        pytorch.load_trial_from_checkpoint_path(folder, torch_load_kwargs={"mmap": True})
    with pytest.raises(TypeError, match="must be True or False"):
        pytorch.load_trial_from_checkpoint_path(folder, torch_load_kwargs={"weights_only": "no"})


def test_a_038_checkpoint_warm_starts_a_new_trial(tmp_path: Path) -> None:
    """A new trial copies the old weights in __init__ (Determined's warm-start recipe), then trains."""
    source_model = tiny_model(seed=11)
    folder = write_038_checkpoint(tmp_path / "ckpt", source_model, experiment_config=FULL_038_CONFIG,
                                  hparams={"lr": 0.05})
    started: list[dict[str, torch.Tensor]] = []

    def build(context: pytorch.PyTorchTrialContext) -> Any:
        source: Any = pytorch.load_trial_from_checkpoint_path(folder, torch_load_kwargs=OPT_IN)
        trial = type(source)(context)
        trial.model.load_state_dict(source.model.state_dict())
        started.append(_weights(trial.model))
        return trial

    trial, _, info = fit(build, config({"global_batch_size": 4, "lr": 0.05}), tmp_path / "run", max_length=Batch(2))
    _assert_same(started[0], _weights(source_model))
    assert not torch.equal(_weights(trial.model)["0.weight"], started[0]["0.weight"])  # it trained on from there
    assert [c.steps_completed for c in info["checkpoints"]] == [2]
