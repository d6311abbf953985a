"""Our hyperparameter space as Optuna distributions (nested groups under dotted names) and Optuna's
parameters back as our nested hparams."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from determined_trials.config import CategoricalHP, ConstHP, DoubleHP, IntHP, LogHP, hparam_leaves, parse_space
from determined_trials.errors import ConfigError

__all__ = ["OptunaSpace"]

_PLAIN = (str, int, float, bool, type(None))


def _plain_choices(vals: tuple[Any, ...]) -> bool:
    """Whether Optuna can hold the categorical's values themselves: plain scalars, told apart by `==`
    (1 and True, or a NaN, would be confused: then the space holds their indices)."""
    if not all(isinstance(v, _PLAIN) for v in vals):
        return False
    if any(isinstance(v, float) and math.isnan(v) for v in vals):
        return False
    return len({(v, isinstance(v, bool)) for v in vals}) == len(vals) == len(set(vals))


class OptunaSpace:
    """The searched hyperparameters as `distributions` (name -> Optuna distribution); consts and plain
    values stay ours. `double` -> FloatDistribution, `int` -> IntDistribution, `log` -> a log-scale
    FloatDistribution over [base**minval, base**maxval] (the same law as base**uniform), `categorical`
    -> CategoricalDistribution of its values (of their indices when they are not plain scalars)."""

    def __init__(self, space: Mapping[str, Any]) -> None:
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        self._space = parse_space(space)
        self.distributions: dict[str, Any] = {}
        self._indexed: dict[str, tuple[Any, ...]] = {}
        for route, spec in hparam_leaves(self._space):
            name = ".".join(route)
            if name in self.distributions:
                raise ConfigError(f"hyperparameters: '{name}' names two hyperparameters (a dotted name and a nested "
                                  "group); rename one of them")
            if isinstance(spec, DoubleHP):
                self.distributions[name] = FloatDistribution(spec.minval, spec.maxval)
            elif isinstance(spec, IntHP):
                self.distributions[name] = IntDistribution(spec.minval, spec.maxval)
            elif isinstance(spec, LogHP):
                low, high = sorted((spec.base**spec.minval, spec.base**spec.maxval))
                self.distributions[name] = FloatDistribution(low, high, log=True)
            elif isinstance(spec, CategoricalHP):
                if _plain_choices(spec.vals):
                    self.distributions[name] = CategoricalDistribution(spec.vals)
                else:
                    self._indexed[name] = spec.vals
                    self.distributions[name] = CategoricalDistribution(tuple(range(len(spec.vals))))

    def hparams(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Our nested hparams (the space's key order) from Optuna's flat `params`."""
        return self._fill(self._space, (), params)

    def params(self, hparams: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """Optuna's flat params (external form) for our nested `hparams` of an earlier trial, or (None, why
        not): each searched hyperparameter must be there with a value its distribution holds. Constants are
        not compared."""
        params: dict[str, Any] = {}
        for name, distribution in self.distributions.items():
            found, value = _lookup(hparams, name.split("."))
            if not found:
                return None, f"it has no hyperparameter '{name}'"
            if name in self._indexed:  # Optuna holds the index of the value
                param = next((i for i, v in enumerate(self._indexed[name]) if v == value), None)
            else:
                param = value
            try:
                held = param is not None and distribution._contains(distribution.to_internal_repr(param))
            except (TypeError, ValueError):
                held = False
            if not held:
                return None, f"its '{name}' = {value!r} is outside {_describe(distribution)}"
            params[name] = param
        return params, ""

    def _fill(self, space: Mapping[str, Any], route: tuple[str, ...], params: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, spec in space.items():
            name = ".".join((*route, key))
            if isinstance(spec, dict):
                out[key] = self._fill(spec, (*route, key), params)
            elif isinstance(spec, ConstHP):
                out[key] = copy.deepcopy(spec.val)
            elif name in self._indexed:
                out[key] = copy.deepcopy(self._indexed[name][int(params[name])])
            elif name in self.distributions:
                out[key] = params[name]
            else:  # a plain value: a constant
                out[key] = copy.deepcopy(spec)
        return out


def _lookup(hparams: Mapping[str, Any], route: list[str]) -> tuple[bool, Any]:
    """(found, value) of the hyperparameter at `route` in nested `hparams`."""
    node: Any = hparams
    for key in route:
        if not isinstance(node, Mapping) or key not in node:
            return False, None
        node = node[key]
    return True, node



def _describe(distribution: Any) -> str:
    """A distribution as a message shows it: the choices (by index for values Optuna cannot hold), or the range."""
    choices = getattr(distribution, "choices", None)
    if choices is not None:
        return f"the choices {list(choices)}"
    step = getattr(distribution, "step", None)
    steps = f" in steps of {step}" if step not in (None, 1) else ""
    return f"the range [{distribution.low}, {distribution.high}]{steps}"
