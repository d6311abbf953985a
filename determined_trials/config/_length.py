"""The `Length` value type (a count with an optional unit) and its config parsers."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import PlainSerializer, PlainValidator

from determined_trials.config._base import ConfigProblems

__all__ = ["Length", "LengthUnit"]

LengthUnit = Literal["batches", "records", "epochs"]
_UNITS: tuple[str, ...] = get_args(LengthUnit)


@dataclass(frozen=True)
class Length:
    """An immutable training length: `value` units, or a bare count when `unit` is None."""

    value: int
    unit: LengthUnit | None = None

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 0:
            raise ValueError(f"Length value must be an integer >= 0, got {self.value!r}")
        if self.unit is not None and self.unit not in _UNITS:
            raise ValueError(f"Length unit must be one of {', '.join(_UNITS)} or None, got {self.unit!r}")

    def as_config(self) -> int | dict[str, int]:
        """The config form: a bare int, or `{unit: value}`."""
        return self.value if self.unit is None else {self.unit: self.value}

    def __str__(self) -> str:
        return str(self.value) if self.unit is None else f"{self.value} {self.unit}"


def _example(minimum: int) -> str:
    return f"e.g. `{{batches: {max(minimum, 1000)}}}`"


def _parse_count(value: Any, minimum: int, unit: str | None) -> int:
    where = f"the number of {unit}" if unit else "the length"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigProblems.at((), f"{where} must be an integer, got {value!r}; {_example(minimum)}")
    if value < minimum:
        raise ConfigProblems.at((), f"{where} must be >= {minimum}, got {value}")
    return value


def _parse_unit_mapping(value: Mapping[Any, Any], minimum: int) -> Length:
    keys = list(value)
    if len(keys) != 1:
        shown = ", ".join(map(str, keys)) or "none"
        raise ConfigProblems.at(
            (), f"a length mapping needs exactly one key (one of {', '.join(_UNITS)}), got "
            f"{len(keys)} ({shown}); {_example(minimum)}"
        )
    unit = keys[0]
    if unit not in _UNITS:
        close = difflib.get_close_matches(str(unit), _UNITS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigProblems.at(
            (), f"unknown length unit {unit!r}; use one of {', '.join(_UNITS)}.{hint}"
        )
    return Length(_parse_count(value[unit], minimum, unit), unit)


def parse_length(value: Any, *, unit_required: bool, minimum: int = 0) -> Length:
    """Parse an int or a single-key `{batches|records|epochs: n}` mapping (or a `Length`)."""
    if isinstance(value, Length):
        if unit_required and value.unit is None:
            raise ConfigProblems.at((), f"this length needs a unit; {_example(minimum)}")
        return Length(_parse_count(value.value, minimum, value.unit), value.unit)
    if isinstance(value, Mapping):
        return _parse_unit_mapping(value, minimum)
    if isinstance(value, int) and not isinstance(value, bool):
        if unit_required:
            raise ConfigProblems.at(
                (), f"a bare number has no unit here; write {_example(minimum)} (or records/epochs)"
            )
        return Length(_parse_count(value, minimum, None))
    kind = "an integer or a mapping" if not unit_required else "a mapping"
    raise ConfigProblems.at(
        (), f"expected {kind} like {{batches: n}}, got {value!r} ({type(value).__name__}); "
        f"{_example(minimum)}"
    )


def _dump(value: Length) -> int | dict[str, int]:
    return value.as_config()


MaxLength = Annotated[
    Length,
    PlainValidator(lambda v: parse_length(v, unit_required=False, minimum=1)),
    PlainSerializer(_dump),
]
"""`searcher.max_length`: an int (units from the trial) or `{batches|records|epochs: n}`, n >= 1."""

Period = Annotated[
    Length,
    PlainValidator(lambda v: parse_length(v, unit_required=True, minimum=0)),
    PlainSerializer(_dump),
]
"""`min_validation_period` / `min_checkpoint_period`: `{batches|records|epochs: n}`, n >= 0."""
