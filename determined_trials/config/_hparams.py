"""Hyperparameter specs (const/int/double/log/categorical, nested groups), random sampling
and grid enumeration."""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    BeforeValidator,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from typing_extensions import TypeAliasType

from determined_trials.config._base import (
    ConfigProblems,
    Loc,
    StrictModel,
    json_value,
    tagged_union,
)
from determined_trials.config._errors import problems_from_validation, raise_problems

__all__ = [
    "CategoricalHP",
    "ConstHP",
    "DoubleHP",
    "HParamSpec",
    "IntHP",
    "LogHP",
    "grid_points",
    "hparam_leaves",
    "parse_space",
    "sample_hparams",
]

_Json = Annotated[Any, BeforeValidator(json_value)]
MAX_GRID_COUNT = 10_000  # grid values of one hyperparameter
MAX_GRID_POINTS = 100_000  # trials of one grid search
_Count = Annotated[int | None, Field(ge=1, le=MAX_GRID_COUNT, description="number of grid points, e.g. `count: 4`")]


class ConstHP(StrictModel):
    """A fixed value: `{type: const, val: ...}`."""

    _keep_nulls: ClassVar[frozenset[str]] = frozenset({"val"})
    type: Literal["const"] = "const"
    val: _Json = Field(description="the constant value, e.g. `val: 0.01`")


class _RangeHP(StrictModel):
    """Shared check for the numeric ranges."""

    if TYPE_CHECKING:
        minval: float
        maxval: float

    @model_validator(mode="after")
    def _check_range(self) -> _RangeHP:
        lo, hi = self.minval, self.maxval
        if lo > hi:
            raise ConfigProblems.at(
                ("maxval",), f"minval ({lo}) is greater than maxval ({hi}); make minval <= maxval"
            )
        return self


class IntHP(_RangeHP):
    """An integer in [minval, maxval] (both inclusive)."""

    type: Literal["int"] = "int"
    minval: int = Field(description="smallest value, e.g. `minval: 1`")
    maxval: int = Field(description="largest value (inclusive), e.g. `maxval: 8`")
    count: _Count = None


class DoubleHP(_RangeHP):
    """A float in [minval, maxval]."""

    type: Literal["double"] = "double"
    minval: float = Field(allow_inf_nan=False, description="smallest value, e.g. `minval: 0.0`")
    maxval: float = Field(allow_inf_nan=False, description="largest value, e.g. `maxval: 0.5`")
    count: _Count = None


class LogHP(_RangeHP):
    """`base ** x` with the exponent x in [minval, maxval]."""

    type: Literal["log"] = "log"
    base: float = Field(default=10.0, gt=0, allow_inf_nan=False, description="the base of the power, e.g. `base: 10`")
    minval: float = Field(allow_inf_nan=False, description="smallest exponent, e.g. `minval: -4` for base**-4")
    maxval: float = Field(allow_inf_nan=False, description="largest exponent, e.g. `maxval: -1` for base**-1")
    count: _Count = None

    @model_validator(mode="after")
    def _check_powers(self) -> LogHP:
        for name in ("minval", "maxval"):
            try:
                value = self.base ** getattr(self, name)
            except OverflowError:
                value = math.inf
            if not math.isfinite(value) or (value == 0.0 and self.base != 0):
                raise ConfigProblems.at((name,), f"base ** {name} = {self.base} ** {getattr(self, name)} is "
                                        "out of a float's range; keep the exponent within about ±300 for base 10")
        return self


class CategoricalHP(StrictModel):
    """One of a list of values."""

    type: Literal["categorical"] = "categorical"
    vals: Annotated[
        tuple[_Json, ...],
        Field(min_length=1, strict=False, description="the choices, e.g. `vals: [32, 64, 128]`"),
    ]


HParamSpec = ConstHP | IntHP | DoubleHP | LogHP | CategoricalHP


def _untyped(value: Any) -> str:
    return "_group" if isinstance(value, Mapping) else "_value"


if TYPE_CHECKING:
    HParam = Any
else:
    HParam = TypeAliasType(
        "HParam",
        tagged_union(
            {
                "const": ConstHP, "int": IntHP, "double": DoubleHP, "log": LogHP,
                "categorical": CategoricalHP, "_group": dict[str, "HParam"], "_value": _Json,
            },
            key="type",
            what="a hyperparameter: a plain value, a mapping with `type:`, or a nested group",
            fallback=_untyped,
        ),
    )
"""One hyperparameter: a spec, a nested group (mapping without `type`) or a plain constant."""

HParams = dict[str, HParam]
_HPARAMS_ADAPTER: TypeAdapter[dict[str, Any]] = TypeAdapter(HParams)


def parse_space(space: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a raw `hyperparameters` mapping (already-parsed specs pass through)."""
    try:
        return _HPARAMS_ADAPTER.validate_python(dict(space))
    except ValidationError as exc:
        raise_problems(problems_from_validation(exc, HParams, prefix=("hyperparameters",)))


def sample_hparam(spec: Any, rng: random.Random) -> Any:
    """One value drawn from a parsed spec (a nested group: a dict of values)."""
    if isinstance(spec, ConstHP):
        return copy.deepcopy(spec.val)
    if isinstance(spec, IntHP):
        return rng.randint(spec.minval, spec.maxval)
    if isinstance(spec, DoubleHP):
        return rng.uniform(spec.minval, spec.maxval)
    if isinstance(spec, LogHP):
        return spec.base ** rng.uniform(spec.minval, spec.maxval)
    if isinstance(spec, CategoricalHP):
        return copy.deepcopy(rng.choice(spec.vals))
    if isinstance(spec, dict):
        return {name: sample_hparam(sub, rng) for name, sub in spec.items()}
    return copy.deepcopy(spec)


def sample_hparams(space: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    """Draw one value per hyperparameter (nested groups recursively), in the space's key order.

    `space` is `ExperimentConfig.hyperparameters` or a raw mapping in the same format.
    """
    parsed = parse_space(space)
    return {name: sample_hparam(spec, rng) for name, spec in parsed.items()}


def _round_half_away(x: float) -> int:
    return math.floor(abs(x) + 0.5) * (1 if x >= 0 else -1)


def _linspace(lo: float, hi: float, count: int) -> list[float]:
    if count == 1:
        return [(lo + hi) / 2.0]
    return [lo + (hi - lo) * i / (count - 1) for i in range(count)]


def _axis(spec: Any) -> list[Any]:
    """All grid values of one (non-group) hyperparameter; count already checked."""
    if isinstance(spec, ConstHP):
        return [spec.val]
    if isinstance(spec, CategoricalHP):
        return list(spec.vals)
    if isinstance(spec, IntHP):
        count = min(spec.count or 1, spec.maxval - spec.minval + 1)
        values = [_round_half_away(v) for v in _linspace(spec.minval, spec.maxval, count)]
        return list(dict.fromkeys(values))
    if isinstance(spec, DoubleHP):
        return _linspace(spec.minval, spec.maxval, spec.count or 1)
    if isinstance(spec, LogHP):
        return [spec.base**e for e in _linspace(spec.minval, spec.maxval, spec.count or 1)]
    return [spec]


def _leaves(space: Mapping[str, Any], route: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name, spec in space.items():
        if isinstance(spec, dict):
            yield from _leaves(spec, (*route, name))
        else:
            yield (*route, name), spec


def hparam_leaves(space: Mapping[str, Any]) -> list[tuple[tuple[str, ...], Any]]:
    """Every (route, spec) of a parsed space, nested groups flattened (route = the names down to it)."""
    return list(_leaves(space))


def grid_count_problems(space: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """The int/double/log hyperparameters that lack the `count` a grid search needs, or a grid with
    more than ``MAX_GRID_POINTS`` points (counted before anything is expanded)."""
    problems: list[tuple[Loc, str]] = []
    size = 1
    for route, spec in _leaves(space):
        if isinstance(spec, (IntHP, DoubleHP, LogHP)) and spec.count is None:
            name = ".".join(route)
            message = (
                f"the grid searcher needs `count` for {spec.type} hyperparameter '{name}'; add "
                "e.g. `count: 4` (the number of grid values between minval and maxval)"
            )
            problems.append(((*route, "count"), message))
        size *= _axis_size(spec)
    if not problems and size > MAX_GRID_POINTS:
        problems.append(((), f"the grid has {size:.3g} points (trials), more than {MAX_GRID_POINTS:,}; lower "
                             "the `count`s or the categorical values, or use the random or adaptive_asha searcher"))
    return problems


def _axis_size(spec: Any) -> int:
    """How many grid values ``_axis(spec)`` gives at most, without making them."""
    if isinstance(spec, CategoricalHP):
        return len(spec.vals)
    if isinstance(spec, IntHP):
        return min(spec.count or 1, spec.maxval - spec.minval + 1)
    if isinstance(spec, (DoubleHP, LogHP)):
        return spec.count or 1
    return 1


def _assemble(route_values: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for route, value in route_values:
        node = out
        for part in route[:-1]:
            node = node.setdefault(part, {})
        node[route[-1]] = copy.deepcopy(value)
    return out


def grid_points(space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every combination of the grid values (the first hyperparameter varies slowest).

    int/double/log need `count` (count 1 gives the midpoint); int values are rounded and
    de-duplicated; categorical contributes all of its values, const and plain values one.
    """
    parsed = parse_space(space)
    problems = grid_count_problems(parsed)
    if problems:
        raise_problems([(("hyperparameters", *loc), msg) for loc, msg in problems])
    leaves = list(_leaves(parsed))
    if not leaves:
        return [_empty_groups(parsed)]
    axes = [[(route, value) for value in _axis(spec)] for route, spec in leaves]
    points = []
    for combo in itertools.product(*axes):
        point = _assemble(list(combo))
        points.append(_merge_empty_groups(parsed, point))
    return points


def _empty_groups(space: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _empty_groups(v) for k, v in space.items() if isinstance(v, dict)}


def _merge_empty_groups(space: Mapping[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    """Keep empty nested groups and the space's key order in a grid point."""
    out: dict[str, Any] = {}
    for name, spec in space.items():
        if isinstance(spec, dict):
            out[name] = _merge_empty_groups(spec, point.get(name, {}))
        else:
            out[name] = point[name]
    return out
