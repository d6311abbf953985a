"""Shared building blocks of the config schema: the strict frozen base model, tagged unions,
JSON-value normalisation and the exception that carries several located problems."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, model_validator

__all__: list[str] = []

TAG_ERROR = "det_tag"
"""pydantic error type raised by a tagged union whose tag is missing or unknown."""

Loc = tuple[str | int, ...]


class ConfigProblems(ValueError):
    """Raised inside validators: one or more problems, each at a path relative to the value."""

    def __init__(self, problems: list[tuple[Loc, str]]) -> None:
        super().__init__("; ".join(msg for _, msg in problems))
        self.problems = problems

    @classmethod
    def at(cls, loc: Loc, message: str) -> ConfigProblems:
        """A single problem at `loc` (relative to the value being validated)."""
        return cls([(loc, message)])


class StrictModel(BaseModel):
    """Frozen, strict, no unknown keys; a known key given as null means "use the default"."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    _keep_nulls: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            keep = cls._keep_nulls
            return {
                k: v for k, v in data.items() if v is not None or k in keep or k not in cls.model_fields
            }
        return data


def json_value(value: Any) -> Any:
    """Normalise a free-form value to plain JSON types (tuples -> lists, keys -> strings)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ConfigProblems.at(
            (), f"value is not JSON-serialisable ({exc}); use only finite numbers, strings, booleans, "
            "null, lists and mappings (no nan or inf)"
        ) from None


def tagged_union(
    members: dict[str, Any],
    *,
    key: str,
    what: str,
    fallback: Callable[[Any], str | None] | None = None,
    nullable: bool = False,
) -> Any:
    """A union picked by `value[key]`; `fallback` names the tag for other inputs.

    Tags starting with '_' are internal (not shown to users as allowed values of `key`).
    `nullable` adds None as a member (`Optional[...]` around a discriminated union is unhashable).
    """
    public = ", ".join(t for t in members if not t.startswith("_"))
    if nullable:
        members = {**members, "_none": type(None)}

    def _pick(value: Any) -> str | None:
        if value is None and nullable:
            return "_none"
        if isinstance(value, BaseModel):
            tag = getattr(value, key, None)
            return tag if isinstance(tag, str) else None
        if isinstance(value, Mapping) and key in value:
            tag = value[key]
            return tag if isinstance(tag, str) else None
        return fallback(value) if fallback is not None else None

    options = tuple(Annotated[tp, Tag(tag)] for tag, tp in members.items())
    return Annotated[
        Union[options],  # noqa: UP007 - a runtime-built union
        Discriminator(
            _pick,
            custom_error_type=TAG_ERROR,
            custom_error_message=what,
            custom_error_context={"key": key, "allowed": public},
        ),
    ]
