"""Writes a checkpoint in Determined 0.38's PyTorchTrial layout (our own fixture, built from the
behaviour reference): state_dict.pth with pickled numpy/Python RNG state, trial_state.pkl,
load_data.json, metadata.json and code/."""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from support.helpers_paths import SUPPORT

CODE = SUPPORT / "det_tutorials" / "ckpt038_code"
TRIAL_SPEC = "det038_model_def:TinyRegression"

# What a 0.38 master records for a small experiment: defaults filled in, cluster keys included.
FULL_038_CONFIG: dict[str, Any] = {
    "bind_mounts": [], "checkpoint_policy": "best",
    "checkpoint_storage": {"type": "shared_fs", "host_path": "/tmp", "storage_path": "determined-checkpoint",
                           "propagation": "rprivate", "container_path": None, "checkpoint_path": None,
                           "tensorboard_path": None, "save_experiment_best": 0, "save_trial_best": 1,
                           "save_trial_latest": 1},
    "data": {}, "data_layer": {"type": "shared_fs", "container_storage_path": None, "host_storage_path": None},
    "debug": False, "description": "tiny", "entrypoint": "model_def:TinyRegression",
    "environment": {"image": {"cpu": "determinedai/pytorch-ngc:0.38.0", "cuda": "x", "rocm": "y"},
                    "environment_variables": {"cpu": [], "cuda": [], "rocm": []}, "force_pull_image": False,
                    "pod_spec": None, "add_capabilities": [], "drop_capabilities": [], "proxy_ports": []},
    "hyperparameters": {"lr": {"type": "const", "val": 0.05}},
    "integrations": None, "labels": [], "log_policies": [], "max_restarts": 5,
    "min_checkpoint_period": {"batches": 0}, "min_validation_period": {"batches": 0}, "name": "tiny-038",
    "optimizations": {"aggregation_frequency": 1, "auto_tune_tensor_fusion": False,
                      "average_aggregated_gradients": True, "average_training_metrics": True,
                      "grad_updates_size_file": None, "gradient_compression": False, "mixed_precision": "O0",
                      "tensor_fusion_cycle_time": 1, "tensor_fusion_threshold": 64},
    "perform_initial_validation": False, "pbs": {}, "preemption_timeout": None,
    "profiling": {"begin_on_batch": 0, "enabled": False, "end_after_batch": None, "sync_timings": True},
    "project": "Uncategorized", "records_per_epoch": 0, "reproducibility": {"experiment_seed": 1700000000},
    "resources": {"devices": [], "is_single_node": None, "max_slots": None, "native_parallel": False,
                  "priority": None, "resource_pool": "default", "shm_size": None, "slots_per_trial": 1,
                  "weight": 1},
    "scheduling_unit": 100,
    "searcher": {"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                 "max_length": {"batches": 100}, "source_checkpoint_uuid": None, "source_trial_id": None},
    "security": None, "slurm": {}, "tensorboard_storage": None, "workspace": "Uncategorized",
}


def tiny_model(seed: int = 5) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def write_038_checkpoint(folder: Path, model: nn.Module, *, experiment_config: dict[str, Any] | None,
                         hparams: dict[str, Any] | None, steps_completed: int = 100) -> Path:
    """The checkpoint folder ``folder`` holding ``model``'s weights in the 0.38 layout."""
    folder.mkdir(parents=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.save({
        "models_state_dict": [model.state_dict()],
        "optimizers_state_dict": [optimizer.state_dict()],
        "lr_schedulers_state_dict": [],
        "callbacks": {},
        "rng_state": {"cpu_rng_state": torch.get_rng_state(), "np_rng_state": np.random.get_state(),
                      "random_rng_state": random.getstate()},
    }, folder / "state_dict.pth")
    with (folder / "trial_state.pkl").open("wb") as f:
        pickle.dump({"trial_id": 3, "last_ckpt": steps_completed, "step_id": 0, "last_val": steps_completed,
                     "batches_trained": steps_completed, "epochs_trained": steps_completed // 4}, f)
    (folder / "load_data.json").write_text(json.dumps({
        "trial_type": "PyTorchTrial", "experiment_config": experiment_config, "hparams": hparams,
        "trial_cls_spec": TRIAL_SPEC, "is_trainer": True,
    }))
    (folder / "metadata.json").write_text(json.dumps({
        "determined_version": "0.38.1", "steps_completed": steps_completed,
        "framework": f"torch-{torch.__version__}", "format": "pickle",
    }, indent=2))
    shutil.copytree(CODE, folder / "code", ignore=shutil.ignore_patterns("__pycache__"))
    return folder
