"""Taking down the in-process torch.distributed group of one that DeepSpeed trials in a test module used."""

from __future__ import annotations

import sys

import torch


def drop_process_group() -> None:
    """Destroy the process group and forget DeepSpeed's groups cloned from it (``deepspeed.utils.groups`` keeps
    its clone of the world group for the process: a later module's new group would meet the stale clone,
    "Group ... is not registered")."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is None:
        return
    for name, value in list(vars(groups).items()):
        if name.startswith("_") and name.endswith("_GROUP") and isinstance(value, torch.distributed.ProcessGroup):
            setattr(groups, name, None)
