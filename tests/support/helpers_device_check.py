"""A CPU stand-in for "the device" in a GPU code path's test: train on the ``meta`` device under a torch
function mode that fails any op mixing tensors of two devices (what CUDA refuses with "Expected all tensors
to be on the same device"), and gives meta tensors' values as zeros where the host reads them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

__all__ = ["META", "DeviceMixError", "SameDevice", "on_the_meta_device"]

META = torch.device("meta")

# What reads a tensor's values on the host: a meta tensor's read as zero (it has no data).
_VALUE_READS: dict[Callable[..., Any], Callable[[torch.Tensor], Any]] = {
    torch.Tensor.item: lambda t: False if t.dtype == torch.bool else 0,
    torch.Tensor.tolist: lambda t: torch.zeros_like(t, device="cpu").tolist(),
    torch.Tensor.__bool__: lambda t: False,
    torch.Tensor.__float__: lambda t: 0.0,
    torch.Tensor.__int__: lambda t: 0,
    torch.Tensor.__index__: lambda t: 0,
}
_TO_HOST = (torch.Tensor.to, torch.Tensor.cpu)
_SET_DATA: Callable[..., Any] = torch.Tensor.data.__set__  # type: ignore[attr-defined]  # `param.data = ...`
# Ops that take tensors of two devices by design: transfers, and nn.Module.to's swap of a parameter's data.
_CROSS_DEVICE = frozenset({torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.copy_, _SET_DATA,
                           torch._has_compatible_shallow_copy_type})


class DeviceMixError(AssertionError):
    """An op got tensors of two devices."""


class SameDevice(TorchFunctionMode):
    """Fails every op (other than a transfer) whose tensor arguments are on more than one device; stricter
    than CUDA, which also takes a CPU scalar tensor as an operand. Meta tensors read on the host give zeros."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if first is not None and first.device == META:
            if func in _VALUE_READS:
                return _VALUE_READS[func](first)
            if func in _TO_HOST:  # a copy of no data: zeros where it goes
                return func(torch.zeros_like(first, device="cpu"), *args[1:], **kwargs)
        if func is torch.Tensor.copy_ and first is not None and args[1].device == META:
            return first  # into a host buffer: no data to copy
        if func not in _CROSS_DEVICE:
            devices = {t.device for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            if len(devices) > 1:
                name = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
                raise DeviceMixError(f"{name} got tensors on {sorted(map(str, devices))}")
        return func(*args, **kwargs)


@contextmanager
def on_the_meta_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Trial contexts built without ``device=`` train on ``meta``, under ``SameDevice``."""
    from determined_trials.pytorch import _context as pytorch_context

    monkeypatch.setattr(pytorch_context, "default_device", lambda local_rank, size: META)
    with SameDevice():
        yield
