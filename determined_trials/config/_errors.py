"""Turns pydantic validation errors into `ConfigError` messages a person can act on: the dotted
path of each offending key, what is wrong and how to fix it."""

from __future__ import annotations

import difflib
import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import (
    Annotated,
    Any,
    ForwardRef,
    Literal,
    NoReturn,
    Union,
    get_args,
    get_origin,
)

from pydantic import BaseModel, Tag, ValidationError
from pydantic.fields import FieldInfo
from typing_extensions import TypeAliasType

from determined_trials.config._base import TAG_ERROR, ConfigProblems, Loc
from determined_trials.errors import ConfigError

__all__: list[str] = []

_KINDS = {
    str: "a string", int: "an integer", float: "a number", bool: "a boolean",
    list: "a list", tuple: "a list", dict: "a mapping", type(None): "null",
}
_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "a string", "dict_type": "a mapping",
    "model_type": "a mapping", "model_attributes_type": "a mapping", "list_type": "a list",
    "tuple_type": "a list", "mapping_type": "a mapping",
}
_BOUNDS = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"),
           "less_than_equal": ("le", "<="), "less_than": ("lt", "<")}


@dataclass
class _Resolved:
    path: list[str | int]
    annotation: Any
    field: FieldInfo | None
    model: type[BaseModel] | None
    is_key: bool = False


def _unwrap(tp: Any, module: str | None) -> tuple[Any, str | None]:
    """Strip Annotated, follow type aliases and string forward references."""
    while True:
        if isinstance(tp, ForwardRef):
            tp = tp.__forward_arg__
        if isinstance(tp, str) and module is not None:
            tp = getattr(sys.modules[module], tp, Any)
        elif isinstance(tp, TypeAliasType):
            module, tp = tp.__module__, tp.__value__
        elif get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        else:
            return tp, module


def _tags(member: Any) -> list[str]:
    if get_origin(member) is Annotated:
        return [m.tag for m in member.__metadata__ if isinstance(m, Tag)]
    return []


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _resolve(root: Any, loc: Loc) -> _Resolved:
    """Walk `loc` through the types, dropping union tags/labels from the user-facing path."""
    res = _Resolved([], root, None, None)
    tp, module, i = root, None, 0
    while i < len(loc):
        element = loc[i]
        tp, module = _unwrap(tp, module)
        if element == "[key]":  # the error is about a mapping key, not its value
            res.is_key, i = True, i + 1
            continue
        if _is_union(tp):
            members = [m for m in get_args(tp) if m is not type(None)]
            tagged = {tag: m for m in members for tag in _tags(m)}
            if isinstance(element, str) and element in tagged:
                tp, i = tagged[element], i + 1
            elif len(members) == 1:
                tp = members[0]
            else:  # the label of a plain union member
                tp, i = Any, i + 1
            continue
        i += 1
        part: str | int = str(element)
        if _is_model(tp):
            res.model = tp
            res.field = tp.model_fields.get(part)
            tp = res.field.annotation if res.field is not None else Any
        elif get_origin(tp) in (dict, Mapping):
            res.field, res.model, tp = None, None, get_args(tp)[1]
        elif get_origin(tp) in (list, tuple):
            res.field, res.model, tp, part = None, None, get_args(tp)[0], element
        else:
            tp, part = Any, element
        res.path.append(part)
    res.annotation = _unwrap(tp, module)[0]
    return res


def format_path(loc: Loc) -> str:
    """`('a', 'b', 0)` -> `a.b[0]`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _show(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({_KINDS.get(type(value), type(value).__name__)})"


def _did_you_mean(word: Any, options: list[str]) -> str:
    close = difflib.get_close_matches(str(word), options, n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def _field_paths(tp: Any, name: str, prefix: str, seen: set[Any]) -> Iterator[str]:
    """Every path in the schema where a field called `name` lives."""
    tp, _ = _unwrap(tp, None)
    if _is_union(tp):
        for member in get_args(tp):
            tags = [t for t in _tags(member) if not t.startswith("_")]
            note = f" (for {prefix.rsplit('.', 1)[-1]} '{tags[0]}')" if tags else ""
            for found in _field_paths(member, name, prefix, seen):
                yield found if "(for " in found else found + note
        return
    if not _is_model(tp) or tp in seen:
        return
    seen = seen | {tp}
    for key, info in tp.model_fields.items():
        path = f"{prefix}.{key}" if prefix else key
        if key == name:
            yield path
        yield from _field_paths(info.annotation, name, path, seen)


def _unknown(res: _Resolved, root: Any) -> str:
    key = res.path[-1]
    allowed = list(res.model.model_fields) if res.model is not None else []
    msg = f"unknown key.{_did_you_mean(key, allowed)}"
    here = format_path(tuple(res.path))
    elsewhere = sorted({p for p in _field_paths(root, str(key), "", set()) if p != here})
    if elsewhere:
        msg += f" It is a valid key at: {', '.join(elsewhere)}."
    fix = f"keys allowed here: {', '.join(allowed)}" if allowed else "remove it"
    return f"{msg} Fix: rename or remove it ({fix})."


def _hint(res: _Resolved) -> str:
    return f" — {res.field.description}" if res.field is not None and res.field.description else ""


def _literal(res: _Resolved, value: Any, ctx: Mapping[str, Any]) -> str:
    if get_origin(res.annotation) is Literal:
        options = [str(o) for o in get_args(res.annotation)]
    else:
        options = [o.strip(" '") for o in str(ctx.get("expected", "")).replace(" or ", ", ").split(",")]
    shown = ", ".join(f"'{o}'" for o in options)
    return f"{_show(value)} is not allowed.{_did_you_mean(value, options)} Fix: use one of {shown}."


def _tag_problem(base: Loc, err: Mapping[str, Any]) -> tuple[Loc, str]:
    ctx, value = err.get("ctx") or {}, err.get("input")
    key, allowed = str(ctx.get("key")), str(ctx.get("allowed")).split(", ")
    choices = ", ".join(allowed)
    if isinstance(value, Mapping):
        if key not in value:
            return (*base, key), f"required key is missing. Fix: add `{key}:` with one of: {choices}."
        tag = value[key]
        return (*base, key), (
            f"{_show(tag)} is not a known {key}.{_did_you_mean(tag, allowed)} "
            f"Fix: use one of: {choices}."
        )
    fix = f"use a mapping with `{key}:` one of: {choices}"
    return base, f"expected {err['msg']}, got {_show(value)}. Fix: {fix}."


def _type_problem(res: _Resolved, typ: str, err: Mapping[str, Any]) -> str:
    ctx, value = err.get("ctx") or {}, err.get("input")
    if typ in _EXPECTED:
        expected = _EXPECTED[typ]
        return f"expected {expected}, got {_show(value)}. Fix: give {expected}{_hint(res)}."
    if typ in _BOUNDS:
        name, op = _BOUNDS[typ]
        bound = f"{op} {ctx.get(name)}"
        return f"must be {bound}, got {value!r}. Fix: give a value {bound}{_hint(res)}."
    if typ == "string_too_short":
        return f"must not be empty. Fix: give a non-empty string{_hint(res)}."
    if typ == "too_short":
        if ctx.get("min_length") == 1:
            return f"must not be empty. Fix: give at least one item{_hint(res)}."
        return f"needs at least {ctx.get('min_length')} items. Fix: add more{_hint(res)}."
    if typ == "literal_error":
        return _literal(res, value, ctx)
    return f"{err['msg']} (got {_show(value)}). Fix: correct this value{_hint(res)}."


def _translate(err: Mapping[str, Any], root: Any, prefix: Loc) -> list[tuple[Loc, str]]:
    res = _resolve(root, tuple(err["loc"]))
    base: Loc = (*prefix, *res.path)
    typ = err["type"]
    if typ in ("value_error", "assertion_error"):
        exc = (err.get("ctx") or {}).get("error")
        if isinstance(exc, ConfigProblems):
            return [((*base, *rel), msg) for rel, msg in exc.problems]
        return [(base, str(exc) if exc is not None else str(err["msg"]))]
    if typ == TAG_ERROR:
        return [_tag_problem(base, err)]
    if typ == "missing":
        hint = _hint(res) or f" — `{res.path[-1]}: <value>`"
        return [(base, f"required key is missing. Fix: add it{hint}.")]
    if res.is_key or typ == "invalid_key":
        key = err.get("input") if res.is_key else err["loc"][-1]
        return [(base, f"keys must be strings, got {_show(key)}. Fix: quote the key, e.g. '{key}':.")]
    if typ == "extra_forbidden":
        return [(base, _unknown(res, root))]
    return [(base, _type_problem(res, typ, err))]


def problems_from_validation(
    exc: ValidationError, root: Any, *, prefix: Loc = ()
) -> list[tuple[Loc, str]]:
    """One (path, message) per distinct problem in a pydantic error, in the order found."""
    problems: list[tuple[Loc, str]] = []
    for err in exc.errors(include_url=False):
        for problem in _translate(err, root, prefix):
            if problem not in problems:
                problems.append(problem)
    return problems


def raise_problems(
    problems: list[tuple[Loc, str]], *, source: str | None = None, what: str = "experiment configuration"
) -> NoReturn:
    """Raise one ConfigError listing every problem (in ``what``) as `path: message`."""
    where = f" in {source}" if source else ""
    count = len(problems)
    lines = [f"Invalid {what}{where} ({count} problem{'s' if count != 1 else ''}):"]
    lines += [f"  - {format_path(loc)}: {msg}" for loc, msg in problems]
    raise ConfigError("\n".join(lines))
