"""The per-key accumulators behind the metric classes: device values kept pending and folded in
bounded steps, and the one host transfer of a workload's results (``to_host``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from determined_trials.pytorch.metrics._reducer import Reducer

__all__ = ["Accumulator", "KeySummary", "Summary", "combine", "is_integral", "keys_error", "shape_error",
           "shape_of", "to_host"]

# Pending device values are folded into the running result once this many elements are waiting
# (and at most every _MAX_PENDING batches), which bounds memory without a kernel per batch.
_PENDING_ELEMENTS = 1 << 16
_MAX_PENDING = 1024
_NUMPY_KINDS = "biuf"


class KeySummary(NamedTuple):
    reducer: Reducer
    value: np.ndarray
    integral: bool


class Summary(NamedTuple):
    """One rank's picklable result: batch count, total weight, and per-key reduced values."""

    batches: int
    weight: float
    keys: dict[str, KeySummary]


class Accumulator:
    """The running reduction of one metric key: device tensors pending, device and host parts."""

    __slots__ = ("device_integral", "host", "host_integral", "key", "limit", "on_device",
                 "pending", "reducer", "shape", "weights")

    def __init__(self, key: str, reducer: Reducer, shape: tuple[int, ...]) -> None:
        self.key, self.reducer, self.shape = key, reducer, shape
        self.limit = max(1, min(_MAX_PENDING, _PENDING_ELEMENTS // max(1, int(np.prod(shape)))))
        self.pending: list[torch.Tensor] = []
        self.weights: list[float] = []
        self.on_device: torch.Tensor | None = None
        self.host: Any = None
        self.device_integral = self.host_integral = True

    def add(self, value: Any, weight: float | None) -> None:
        if isinstance(value, torch.Tensor):
            if value.shape != self.shape:
                raise shape_error(self.key, self.shape, tuple(value.shape))
            self.pending.append(value.detach())
            if weight is not None:
                self.weights.append(weight)
            if len(self.pending) >= self.limit:
                self.compact()
            return
        value = host_value(self.key, value)
        shape = () if isinstance(value, (int, float)) else value.shape
        if shape != self.shape:
            raise shape_error(self.key, self.shape, shape)
        self.host_integral = self.host_integral and is_integral(value)
        if weight is not None and self.reducer is Reducer.AVG:
            value = value * weight
        self.host = value if self.host is None else combine(self.reducer, self.host, value)

    def compact(self) -> None:
        """Fold the pending tensors into the device result (kernels only, no host sync)."""
        if not self.pending:
            return
        stacked = self._stack_pending()
        if stacked.is_complex():
            raise TypeError(f"metric {self.key!r} is a complex tensor; report real numbers")
        integral = not stacked.is_floating_point() and self.reducer is not Reducer.AVG
        float_dtype = torch.float32 if stacked.device.type == "mps" else torch.float64
        stacked = stacked.to(torch.int64 if integral else float_dtype)
        self.device_integral = self.device_integral and integral
        if self.reducer is Reducer.MAX:
            part = stacked.amax(0)
        elif self.reducer is Reducer.MIN:
            part = stacked.amin(0)
        elif self.weights and self.reducer is Reducer.AVG:
            weights = torch.tensor(self.weights, dtype=stacked.dtype)
            if stacked.is_cuda:
                weights = weights.pin_memory()
            weights = weights.to(stacked.device, non_blocking=True)
            part = (stacked * weights.reshape(-1, *[1] * len(self.shape))).sum(0)
        else:
            part = stacked.sum(0)
        self.on_device = part if self.on_device is None else combine(self.reducer, self.on_device, part)
        self.pending.clear()  # in place: the trainer's fast path appends to this very list
        self.weights.clear()

    def _stack_pending(self) -> torch.Tensor:
        """The pending tensors stacked, after checking their shapes (the trainer's fast path appends
        losses without a per-batch check; a changed shape is reported here, at the boundary)."""
        try:
            stacked = torch.stack(self.pending)
        except RuntimeError:
            stacked = None
        if stacked is None or tuple(stacked.shape[1:]) != self.shape:
            wrong = next((t for t in self.pending if tuple(t.shape) != self.shape), self.pending[0])
            raise shape_error(self.key, self.shape, tuple(wrong.shape))
        return stacked


def combine(reducer: Reducer, left: Any, right: Any) -> Any:
    if reducer is Reducer.MAX or reducer is Reducer.MIN:
        if isinstance(left, torch.Tensor):
            return (torch.maximum if reducer is Reducer.MAX else torch.minimum)(left, right)
        return (np.maximum if reducer is Reducer.MAX else np.minimum)(left, right)
    return left + right


def host_value(key: str, value: Any) -> Any:
    """A Python number or a numpy array; TypeError naming the key for anything else."""
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in _NUMPY_KINDS:
        array = np.array(value)
        return array.astype(np.int64) if array.dtype.kind == "b" else array
    raise TypeError(
        f"metric {key!r} is a {type(value).__module__}.{type(value).__qualname__}; metrics must be "
        "tensors, numpy arrays or Python numbers (return other values from a reducer instead)"
    )


def is_integral(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, np.ndarray) and value.dtype.kind in "biu")


def shape_of(key: Any, value: Any) -> tuple[int, ...]:
    if not isinstance(key, str):
        raise TypeError(f"metric names must be strings, got {key!r}")
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    return tuple(np.shape(host_value(key, value)))


def shape_error(key: str, expected: tuple[int, ...], got: tuple[int, ...]) -> ValueError:
    return ValueError(
        f"metric {key!r} has shape {list(got)} in this batch but {list(expected)} before; a metric "
        "must keep one shape for a whole workload (it is averaged element-wise)"
    )


def keys_error(what: str, expected: Sequence[Any], got: Sequence[Any]) -> ValueError:
    missing = sorted(map(str, set(expected) - set(got)))
    extra = sorted(map(str, set(got) - set(expected)))
    return ValueError(
        f"{what} must return the same metric names for every batch: expected {expected}, "
        f"got {got} (missing {missing}, unexpected {extra})"
    )


def to_host(accumulators: Sequence[Accumulator]) -> dict[str, np.ndarray]:
    """Every device result, moved to the host with one transfer per device."""
    by_device: dict[torch.device, list[tuple[Accumulator, torch.Tensor]]] = {}
    for acc in accumulators:
        acc.compact()
        if acc.on_device is not None:
            by_device.setdefault(acc.on_device.device, []).append((acc, acc.on_device))
    results: dict[str, np.ndarray] = {}
    for device, pairs in by_device.items():
        dtype = torch.float32 if device.type == "mps" else torch.float64
        flat = torch.cat([tensor.reshape(-1).to(dtype) for _, tensor in pairs])
        values = flat.cpu().numpy().astype(np.float64)
        offset = 0
        for acc, tensor in pairs:
            size = tensor.numel()
            results[acc.key] = values[offset:offset + size].reshape(acc.shape)
            offset += size
    return results
