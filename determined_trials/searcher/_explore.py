"""PBT's explore step: a child's hyperparameters near its parent's, by Determined's rule.

For every hyperparameter, in the order of its dotted name (nested groups included): with probability
``resample_probability`` it is drawn afresh from its range; otherwise a number is multiplied by
``1 - perturb_factor`` or ``1 + perturb_factor`` (a fair coin) and kept inside its range: an ``int`` is
rounded down when it shrinks and up when it grows, a ``log`` is kept within ``base**minval`` and
``base**maxval``. Categoricals and constants are only ever changed by a resample (a constant's resample
is itself).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Mapping
from typing import Any

from determined_trials.config import DoubleHP, IntHP, LogHP, hparam_leaves, parse_space, sample_hparam

__all__ = ["explore_hparams"]


def _get(hparams: Mapping[str, Any], route: tuple[str, ...]) -> Any:
    node: Any = hparams
    for part in route:
        node = node[part]
    return node


def _set(hparams: dict[str, Any], route: tuple[str, ...], value: Any) -> None:
    node = hparams
    for part in route[:-1]:
        node = node.setdefault(part, {})
    node[route[-1]] = value


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _perturb(spec: Any, value: Any, decrease: bool, factor: float) -> Any:
    multiplier = 1.0 - factor if decrease else 1.0 + factor
    if isinstance(spec, IntHP):
        moved = math.floor(value * multiplier) if decrease else math.ceil(value * multiplier)
        return int(_clamp(moved, spec.minval, spec.maxval))
    if isinstance(spec, DoubleHP):
        return _clamp(value * multiplier, spec.minval, spec.maxval)
    if isinstance(spec, LogHP):
        return _clamp(value * multiplier, spec.base**spec.minval, spec.base**spec.maxval)
    return copy.deepcopy(value)  # categorical, const, plain value: unchanged


def explore_hparams(
    space: Mapping[str, Any], parent: Mapping[str, Any], rng: random.Random, *,
    resample_probability: float, perturb_factor: float,
) -> dict[str, Any]:
    """A child's hyperparameters from its ``parent``'s (see the module docstring); ``rng`` is advanced by
    one draw per hyperparameter, and a second one for each that is not resampled."""
    parsed = parse_space(space)
    child = copy.deepcopy(dict(parent))
    for route, spec in sorted(hparam_leaves(parsed), key=lambda leaf: ".".join(leaf[0])):
        if rng.random() < resample_probability:
            _set(child, route, sample_hparam(spec, rng))
        else:
            decrease = rng.random() < 0.5
            _set(child, route, _perturb(spec, _get(parent, route), decrease, perturb_factor))
    return child
