"""Starting from another trial's checkpoint with other hyperparameters (a PBT child): the optimizer settings
the trial's ``__init__`` built from its own hyperparameters win over the checkpoint's.

A checkpoint restores each optimizer's ``param_groups`` too, so without this a child's new ``lr`` (built
into its optimizer by ``__init__``) would be overwritten by its parent's. After the load, for every
param group: the settings other than ``lr`` (``weight_decay``, ``momentum``, ``betas``, ...) are the built
ones; ``lr`` is the built one, or, when an LR scheduler drives the group (it has ``initial_lr``), the
checkpoint's scheduled ``lr`` rescaled by built ``initial_lr`` / checkpoint ``initial_lr`` (the schedule
goes on where it was, from the new base), with the schedulers' ``base_lrs`` set to the new base. The
optimizer's state (momentum buffers, Adam moments, step counts) stays the checkpoint's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

__all__ = ["hparams_changed", "optimizer_settings", "reapply_optimizer_settings"]

_NOT_SETTINGS = frozenset({"params", "lr", "initial_lr"})


def hparams_changed(load_data: Path, hparams: dict[str, Any]) -> bool:
    """Whether the checkpoint's ``load_data.json`` names other hyperparameters than ``hparams`` (a checkpoint
    without one is taken as written with the same)."""
    try:
        saved = json.loads(load_data.read_text()).get("hparams")
    except (OSError, ValueError):
        return False
    ours = json.loads(json.dumps(hparams, default=str))
    return saved is not None and saved != ours


def optimizer_settings(optimizers: list[torch.optim.Optimizer]) -> list[list[dict[str, Any]]]:
    """Each optimizer's param-group settings as built (everything but the parameters), before a load."""
    return [[{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups] for opt in optimizers]


def _scaled_lr(loaded: dict[str, Any], built: dict[str, Any]) -> Any:
    old_base, new_base = loaded.get("initial_lr"), built.get("initial_lr", built.get("lr"))
    if old_base is None or not old_base:
        return built["lr"]
    return loaded["lr"] * (new_base / old_base)


def reapply_optimizer_settings(
    optimizers: list[torch.optim.Optimizer], schedulers: list[Any], built: list[list[dict[str, Any]]],
) -> None:
    """After a checkpoint was loaded: the built settings back (see the module docstring)."""
    for opt, groups in zip(optimizers, built):
        for group, made in zip(opt.param_groups, groups):
            for key, value in made.items():
                if key not in _NOT_SETTINGS:
                    group[key] = value
            if "lr" in made:
                group["lr"] = _scaled_lr(group, made)
            if "initial_lr" in group:
                group["initial_lr"] = made.get("initial_lr", made.get("lr"))
    for wrapped in schedulers:
        scheduler = getattr(wrapped, "scheduler", wrapped)
        driven = getattr(scheduler, "optimizer", None)
        if driven is None or not any(driven is o for o in optimizers):
            continue
        if hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [g.get("initial_lr", g["lr"]) for g in driven.param_groups]
        if hasattr(scheduler, "_last_lr"):
            scheduler._last_lr = [g["lr"] for g in driven.param_groups]
