"""The FSDP2 example (examples/fsdp_mlp) as the launch tests run it: its experiment config, every tensor of a
DCP checkpoint flattened, and the last checkpoint of a run folder (shared by the torchrun and Ray tests)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

import determined_trials as det
from support.helpers_paths import REPO

__all__ = ["BATCHES", "EXAMPLE", "dcp_tensors", "fsdp_config", "last_checkpoint"]

EXAMPLE = REPO / "examples" / "fsdp_mlp"
BATCHES = 16


def fsdp_config(folder: Path, name: str, **hparams: object) -> Path:
    """Write the example's config (2 slots, BATCHES batches) as ``folder/name``, hparams overriding."""
    hp = {"global_batch_size": 16, "lr": 0.01, "width": 16, "depth": 2, "clip": 1.0, **hparams}
    path = folder / name
    path.write_text(textwrap.dedent(f"""
        name: fsdp
        entrypoint: model_def:FSDPMLPTrial
        hyperparameters: {hp!r}
        searcher: {{name: single, metric: validation_loss, max_length: {{batches: {BATCHES}}}}}
        min_validation_period: {{batches: 8}}
        min_checkpoint_period: {{batches: 4}}
        resources: {{slots_per_trial: 2}}
        reproducibility: {{experiment_seed: 7}}
    """).replace("'", ""))
    return path


def dcp_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor in the checkpoint folder's ``dcp/``, by dotted name, loaded in this process."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        walk("", _load_state_dict_from_keys(checkpoint_id=str(folder / "dcp")))
    return flat


def last_checkpoint(run_dir: Path) -> tuple[str, Path]:
    """The run's last checkpoint (uuid, folder), which must be at BATCHES."""
    checkpoint = det.core.LocalStore(run_dir).checkpoints()[-1]
    assert checkpoint.steps_completed == BATCHES
    return checkpoint.uuid, run_dir / "checkpoints" / checkpoint.uuid
