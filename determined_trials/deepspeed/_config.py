"""``overwrite_deepspeed_config``: a DeepSpeed config (file or dict) with leaves replaced from another dict."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["overwrite_deepspeed_config", "read_deepspeed_config"]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r} in the DeepSpeed config; give each key once")
        seen[key] = value
    return seen


def read_deepspeed_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A DeepSpeed JSON config file as a dict (duplicate keys are an error, as in DeepSpeed)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"DeepSpeed config file {str(file)!r} does not exist")
    try:
        loaded = json.loads(file.read_text(), object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise ValueError(f"DeepSpeed config file {str(file)!r} is not valid JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"DeepSpeed config file {str(file)!r} must hold a JSON object, got {type(loaded).__name__}")
    return loaded


def _merge(base: dict[str, Any], source: Mapping[str, Any]) -> None:
    for key, value in source.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def overwrite_deepspeed_config(base_ds_config: str | os.PathLike[str] | dict[str, Any],
                               source_ds_dict: dict[str, Any]) -> dict[str, Any]:
    """A new dict: ``base_ds_config`` (a JSON file path or a dict) with ``source_ds_dict`` merged in.

    Nested dicts of the source merge into the base's dicts of the same key; any other value
    (including a new key) replaces the base's. Neither input is modified.
    """
    if isinstance(base_ds_config, (str, os.PathLike)):
        base = read_deepspeed_config(base_ds_config)
    elif isinstance(base_ds_config, dict):
        base = copy.deepcopy(base_ds_config)
    else:
        raise TypeError("Expected string or dict for base_ds_config argument, got "
                        f"{type(base_ds_config).__name__}")
    if not isinstance(source_ds_dict, Mapping):
        raise TypeError(f"source_ds_dict must be a dict, got {type(source_ds_dict).__name__}")
    _merge(base, source_ds_dict)
    return base
