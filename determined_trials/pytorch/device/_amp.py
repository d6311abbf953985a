"""Automatic mixed precision: default autocast dtypes, the autocast forward that `use_amp()`
installs on wrapped models, and the GradScaler it needs (float16 only)."""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["default_autocast_dtype", "install_autocast_forward", "make_autocast", "needs_scaler",
           "separate_compiled_graphs_by_autocast_dtype"]

logger = logging.getLogger("determined_trials.pytorch")

_SUPPORTED = (torch.float16, torch.bfloat16)
# The first torch whose AOTAutograd cache key holds the autocast dtype, not only whether autocast is on.
_CACHE_KEYS_AUTOCAST_DTYPE = "2.13"
_cache_checked = False


def separate_compiled_graphs_by_autocast_dtype() -> None:
    """On torch < 2.13, turn AOTAutograd's cache off for this process (once, logged).

    Its key there says whether autocast is on but not in which dtype, so a model compiled under
    bfloat16 autocast is served, from memory or from the on-disk cache of an earlier process, to a
    run under float16: that run silently computes in bfloat16, or fails in backward on CUDA
    ("Found dtype Float but expected BFloat16"). Inductor's own graph cache stays on.
    """
    global _cache_checked
    if _cache_checked:
        return
    _cache_checked = True
    functorch_config = getattr(getattr(torch, "_functorch", None), "config", None)
    if torch.__version__ >= _CACHE_KEYS_AUTOCAST_DTYPE or not getattr(functorch_config, "enable_autograd_cache", False):
        return
    functorch_config.enable_autograd_cache = False  # type: ignore[union-attr]
    logger.info(
        "torch %s: AOTAutograd's compile cache is off for this process, which uses autocast: its key lacks the "
        "autocast dtype before torch 2.13, so a graph compiled under one dtype would be reused under another",
        torch.__version__,
    )


def default_autocast_dtype(device: torch.device) -> torch.dtype:
    """float16 on CUDA (with a GradScaler, as Determined's use_amp), bfloat16 elsewhere (the CPU:
    fast there, and float32's range needs no loss scaling)."""
    return torch.bfloat16 if device.type == "cpu" else torch.float16


def make_autocast(device: torch.device, dtype: torch.dtype | None, enabled: bool) -> torch.autocast:
    """A `torch.autocast` for `device` (default dtype from `default_autocast_dtype`)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"autocast(enabled=...) must be True or False, got {enabled!r}")
    chosen = default_autocast_dtype(device) if dtype is None else dtype
    if chosen not in _SUPPORTED:
        raise ValueError(
            f"autocast dtype must be torch.float16 or torch.bfloat16, got {chosen!r}; "
            "leave it out for the device's default"
        )
    if enabled:
        separate_compiled_graphs_by_autocast_dtype()
    return torch.autocast(device_type=device.type, dtype=chosen, enabled=enabled)


def needs_scaler(dtype: torch.dtype) -> bool:
    """float16 gradients underflow without loss scaling; bfloat16 has float32's range."""
    return dtype == torch.float16


class _AutocastForward:
    """A model's forward run under autocast, with low-precision floating outputs cast to float32.

    Installed as the instance attribute `forward`, so `model(x)` (and DDP, which calls the inner
    module) runs it. Holds only plain values, so the model still deep-copies and pickles.
    """

    def __init__(self, forward: Any, device_type: str, dtype: torch.dtype) -> None:
        self.inner = forward
        self.device_type = device_type
        self.dtype = dtype
        self.warned: set[type] = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            output = self.inner(*args, **kwargs)
        return self._to_float32(output)

    def _to_float32(self, output: Any) -> Any:
        if isinstance(output, torch.Tensor):
            return output.float() if output.dtype == self.dtype else output
        if isinstance(output, dict):
            return {key: self._to_float32(value) for key, value in output.items()}
        if isinstance(output, tuple) and hasattr(type(output), "_fields"):
            return type(output)(*(self._to_float32(value) for value in output))
        if isinstance(output, (list, tuple)):
            return type(output)(self._to_float32(value) for value in output)
        if output is not None and type(output) not in self.warned:
            self.warned.add(type(output))
            logger.warning(
                "use_amp(): the model returned a %r; its tensors (if any) stay in %s. Return tensors, "
                "or dicts/lists/tuples of them, to get float32 outputs",
                type(output).__qualname__, self.dtype,
            )
        return output


def install_autocast_forward(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Make `model`'s forward run under autocast (once; a second call changes nothing)."""
    current = model.__dict__.get("forward")
    if isinstance(current, _AutocastForward):
        return
    model.forward = _AutocastForward(model.forward, device.type, dtype)
