"""Where a PyTorch trial's tensors live: the default device, and `to_device` for nested batches."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["default_device", "to_device"]

logger = logging.getLogger("determined_trials.pytorch")

_NUMERIC_KINDS = frozenset("biufc")  # bool, signed, unsigned, float, complex


def default_device(local_rank: int, size: int) -> torch.device:
    """`cuda:<local_rank>` for a distributed job with GPUs, `cuda:0` for one process, else CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if size <= 1:
        return torch.device("cuda", 0)
    count = torch.cuda.device_count()
    index = local_rank
    if local_rank >= count:
        index = local_rank % count
        logger.warning(
            "local rank %d sees only %d GPU(s); using cuda:%d (GPUs are shared by processes)",
            local_rank, count, index,
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def to_device(data: Any, device: torch.device, warned: set[type]) -> Any:
    """`data` with every tensor, numeric numpy array and object with `.to` moved to `device`.

    Recurses into dicts (and other mappings), lists, tuples and namedtuples. Anything else is
    returned unchanged, with one warning per type (`warned` records the types already reported).
    """
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=device.type == "cuda")
    if isinstance(data, np.ndarray):
        return _array_to_device(data, device, warned)
    if type(data) in (tuple, list) and all(isinstance(t, torch.Tensor) and t.device == device for t in data):
        return data  # the common batch: tensors already where they belong
    if isinstance(data, tuple):
        items = [to_device(item, device, warned) for item in data]
        if hasattr(type(data), "_fields"):  # a namedtuple
            return type(data)(*items)
        return _rebuild(type(data), items, tuple)
    if isinstance(data, list):
        return _rebuild(type(data), [to_device(item, device, warned) for item in data], list)
    if isinstance(data, Mapping):
        moved = {key: to_device(value, device, warned) for key, value in data.items()}
        return _rebuild(type(data), moved, dict)
    mover = getattr(data, "to", None)
    if callable(mover):
        return mover(device)
    if data is not None:
        _warn_once(type(data), warned)
    return data


def _array_to_device(array: np.ndarray, device: torch.device, warned: set[type]) -> Any:
    if array.dtype.kind not in _NUMERIC_KINDS:
        _warn_once(type(array), warned, f" with dtype {array.dtype}")
        return array
    contiguous = np.ascontiguousarray(array)
    if not contiguous.flags.writeable:
        contiguous = contiguous.copy()
    try:
        tensor = torch.from_numpy(contiguous)
    except TypeError:  # a numpy dtype torch has no tensor type for
        _warn_once(type(array), warned, f" with dtype {array.dtype}")
        return array
    return tensor.to(device, non_blocking=device.type == "cuda")


def _rebuild(kind: type, items: Any, fallback: type) -> Any:
    """The container `kind` rebuilt from `items`, or the plain `fallback` type if that fails."""
    if kind is fallback:
        return items if type(items) is fallback else fallback(items)
    try:
        return kind(items)
    except Exception:  # noqa: BLE001 - a subclass with another constructor: keep the plain type
        return fallback(items)


def _warn_once(kind: type, warned: set[type], detail: str = "") -> None:
    if kind in warned:
        return
    warned.add(kind)
    logger.warning(
        "to_device: left a data item of type %r%s where it is (it is not a tensor, a numeric numpy "
        "array or an object with a .to() method); move it yourself if the model needs it on the "
        "device", kind.__qualname__, detail,
    )
