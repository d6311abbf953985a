"""Turning user metrics into JSON values: numbers, strings, lists and dicts, with clear errors.

numpy scalars and 0-d framework tensors (torch, TensorFlow) become Python numbers; anything else
that JSON cannot hold is an error naming the offending key. Frameworks are never imported here:
tensors are recognised by duck typing.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["check_group_name", "scalar_items", "to_json_metrics"]

_PLAIN = (float, int, str)  # exact types that are JSON values as they are (bool is not among them)


def check_group_name(group: str) -> None:
    """Metric groups are non-empty strings without '.' (it separates group and key in tags)."""
    if not isinstance(group, str) or not group:
        raise ValueError(f"metrics group must be a non-empty string, got {group!r}")
    if "." in group:
        raise ValueError(
            f"metrics group {group!r} contains '.', which is not allowed; use '_' or '-' instead"
        )


def to_json_metrics(metrics: Mapping[str, Any], *, what: str = "metrics") -> dict[str, Any]:
    """A copy of ``metrics`` holding only JSON values; raises TypeError naming the bad key."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"{what} must be a dict of name -> value, got {type(metrics).__name__}")
    converted: dict[str, Any] = {}
    for key, value in metrics.items():
        if type(value) in _PLAIN and type(key) is str:  # the common case: no location string to build
            converted[key] = value
        else:
            converted[_check_key(key, what)] = _convert(value, f"{what}[{key!r}]")
    return converted


def scalar_items(metrics: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The (key, value) pairs of already-converted metrics that are plain numbers (for plots)."""
    return [
        (key, float(value))
        for key, value in metrics.items()
        if type(value) is float or (isinstance(value, numbers.Real) and not isinstance(value, bool))
    ]


def _check_key(key: Any, what: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"{what} keys must be strings, got {key!r} ({type(key).__name__})")
    return key


def _convert(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (np.generic, np.ndarray)):
        return _convert_numpy(value, where)
    if _is_framework_tensor(value):
        return _convert_tensor(value, where)
    if isinstance(value, Mapping):
        return {_check_key(k, where): _convert(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_convert(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which is not "
        "JSON-serialisable; report a number, a string, a list or a dict of those"
    )


def _convert_numpy(value: np.generic | np.ndarray, where: str) -> Any:
    """A numpy scalar as a number, an array as a (nested) list, as Determined stores them."""
    if value.ndim == 0:
        return _convert(value.item(), where)
    return _convert(value.tolist(), where)


def _is_framework_tensor(value: Any) -> bool:
    module = type(value).__module__
    return module.startswith(("torch", "tensorflow")) and hasattr(value, "shape")


def _convert_tensor(value: Any, where: str) -> Any:
    shape = tuple(value.shape)
    if shape != ():
        raise TypeError(
            f"{where} is a tensor of shape {shape}; report a 0-d tensor or a number "
            "(e.g. t.mean()) or a list (t.tolist())"
        )
    if hasattr(value, "item"):
        return _convert(value.item(), where)
    return _convert(value.numpy().item(), where)

