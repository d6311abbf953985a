"""The trial's TensorBoard folder for PyTorch: a lazy `SummaryWriter` and a `torch.profiler`
whose traces land in that folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["make_profiler", "make_summary_writer"]


def make_summary_writer(path: Path) -> Any:
    """A `torch.utils.tensorboard.SummaryWriter` writing event files into `path`."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # tensorboard is a dependency, but be clear if it is missing
        raise ImportError(
            "get_tensorboard_writer() needs the `tensorboard` package: pip install tensorboard"
        ) from exc
    path.mkdir(parents=True, exist_ok=True)
    return SummaryWriter(log_dir=str(path))


def make_profiler(path: Path, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.profiler.profile:
    """A `torch.profiler.profile(*args, **kwargs)` whose traces go to `path` (TensorBoard plugin)."""
    if "on_trace_ready" in kwargs:
        raise TypeError(
            "set_profiler() sets on_trace_ready itself (traces go to the trial's TensorBoard folder); "
            "leave it out, or build and drive your own torch.profiler.profile in train_batch"
        )
    path.mkdir(parents=True, exist_ok=True)
    handler = torch.profiler.tensorboard_trace_handler(str(path))
    return torch.profiler.profile(*args, on_trace_ready=handler, **kwargs)
