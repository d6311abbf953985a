"""The weights-only load of a warm start (``searcher.source_*``) for FSDP2 trials and DCP checkpoints,
in one process without torch.distributed: a DCP checkpoint's and a plain ``state_dict.pth``'s models load
exactly, and a model that does not fit names the first mismatched key before anything is loaded."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from determined_trials.pytorch.checkpoint import load_model_weights
from determined_trials.pytorch.parallel import DCP_DIR, is_dcp_checkpoint


def _model(hidden: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def _dcp_checkpoint(path: Path, model: nn.Module) -> Path:
    """A checkpoint folder with the models as our FSDP2 checkpoints save them (``model.<i>.<name>``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": get_model_state_dict(nn.ModuleList([model]))}, checkpoint_id=path / DCP_DIR, no_dist=True)
    assert is_dcp_checkpoint(path)
    return path


def _plain_checkpoint(path: Path, model: nn.Module) -> Path:
    path.mkdir(parents=True)
    torch.save({"models_state_dict": [model.state_dict()]}, path / "state_dict.pth")
    return path


@pytest.mark.parametrize("write", [_dcp_checkpoint, _plain_checkpoint])
def test_the_source_weights_load_exactly(tmp_path: Path, write: Callable[[Path, nn.Module], Path]) -> None:
    source = _model(seed=1)
    path = write(tmp_path / "ckpt", source)
    target = _model(seed=2)
    assert not torch.equal(target[0].weight, source[0].weight)
    load_model_weights(path, [target])
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value)


@pytest.mark.parametrize("write", [_dcp_checkpoint, _plain_checkpoint])
def test_a_model_that_does_not_fit_names_the_first_mismatched_key(tmp_path: Path, write: Callable[[Path, nn.Module], Path]) -> None:
    path = write(tmp_path / "ckpt", _model(hidden=3))
    target = _model(hidden=5)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"first mismatched key '0.weight': shape \[3, 4\] in the checkpoint, "
                                           r"\[5, 4\] in the trial's model"):
        load_model_weights(path, [target])
    assert all(torch.equal(target.state_dict()[k], v) for k, v in before.items())  # nothing loaded
