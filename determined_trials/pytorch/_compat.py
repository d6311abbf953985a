"""Module-level helpers Determined's PyTorch code imports by name: ``TorchData``, ``to_device`` and
``adapt_batch_sampler`` (the repeat -> shard -> skip chain for a hand-built batch sampler)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from determined_trials.pytorch import samplers
from determined_trials.pytorch.device import to_device as _to_device

__all__ = ["TorchData", "adapt_batch_sampler", "to_device"]

TorchData = dict[str, torch.Tensor] | Sequence[torch.Tensor] | torch.Tensor
"""What a batch usually is: a tensor, a sequence of tensors or a dict of them (a type alias)."""


def to_device(data: Any, device: torch.device | str, warned_types: set[type] | None = None) -> Any:
    """``data`` (nested dicts/lists/tuples of tensors and numeric arrays) moved to ``device``.

    Items that cannot be moved are returned as they are, with one warning per type; pass the same
    ``warned_types`` set across calls to warn once per type overall.
    """
    return _to_device(data, torch.device(device), set() if warned_types is None else warned_types)


def adapt_batch_sampler(
    batch_sampler: torch.utils.data.BatchSampler | Any, repeat: bool = False, skip: int = 0,
    num_replicas: int = 1, rank: int = 0,
) -> Any:
    """``batch_sampler`` made endless (``repeat``), sharded (``num_replicas`` > 1) and skipping its first
    ``skip`` batches of this rank, in that order (skip counts this rank's batches after sharding)."""
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
        raise ValueError(f"adapt_batch_sampler: skip must be an integer >= 0, got {skip!r}")
    adapted = batch_sampler
    if repeat:
        adapted = samplers.RepeatBatchSampler(adapted)
    if num_replicas > 1:
        adapted = samplers.DistributedBatchSampler(adapted, num_replicas, rank)
    if skip > 0:
        adapted = samplers.SkipBatchSampler(adapted, skip)
    return adapted
