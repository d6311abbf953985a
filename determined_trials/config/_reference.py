"""The configuration reference (docs/config-reference.md), generated from the schema so that it never
drifts: every key with its type, default and description, per section, per searcher, per storage
type and per hyperparameter type. Regenerate with ``make config-reference`` (or
``python -m determined_trials.config._reference > docs/config-reference.md``)."""

from __future__ import annotations

import enum
import re
import sys
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from determined_trials.config._hparams import (
    MAX_GRID_COUNT,
    MAX_GRID_POINTS,
    CategoricalHP,
    ConstHP,
    DoubleHP,
    IntHP,
    LogHP,
)
from determined_trials.config._load import MAX_DEPTH, MAX_NODES
from determined_trials.config._schema import ExperimentConfig, Mesh
from determined_trials.config._searcher import (
    AdaptiveASHASearcher,
    GridSearcher,
    OptunaSearcher,
    PBTSearcher,
    RandomSearcher,
    SingleSearcher,
)
from determined_trials.config._storage import AzureStorage, DirectoryStorage, GCSStorage, S3Storage, SharedFSStorage

__all__ = ["render_reference"]

_HEADER = """# Experiment configuration reference

Generated from the schema by `make config-reference` (`determined_trials/config/_reference.py`);
do not edit by hand: `tests/config/test_config_reference.py` fails when this file is stale.

A config is YAML (or a dict) parsed once by `determined_trials.config.load_config`. Unknown keys
are errors with a "did you mean"; a key given as `null` takes its default. Limits that keep a
hostile config from hanging: at most {depth} levels of nesting and {nodes:,} values (YAML aliases
expanded); a grid `count` of at most {count:,} and a grid of at most {points:,} points; numbers
must be finite.
"""

_SECTIONS: list[tuple[str, str, list[type[BaseModel]]]] = [
    ("resources.mesh", "PyTorchTrial only (a DeepSpeed or Keras trial refuses it); the sizes multiply to "
     "`slots_per_trial` ([fsdp.md](fsdp.md#hsdp-and-tensor-parallel-a-device-mesh)).", [Mesh]),
    ("searcher", "One of these, chosen by `name`.",
     [SingleSearcher, GridSearcher, RandomSearcher, AdaptiveASHASearcher, OptunaSearcher, PBTSearcher]),
    ("checkpoint_storage", "A path (`/data/ckpts`, `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix` "
     "with `AZURE_STORAGE_CONNECTION_STRING`), or one of these, chosen by `type` (default: `<run dir>/checkpoints`).",
     [SharedFSStorage, DirectoryStorage, S3Storage, GCSStorage, AzureStorage]),
    ("hyperparameters", "A mapping of name -> a plain value (a constant), a nested mapping without `type` "
     "(a group), or one of these, chosen by `type`.", [ConstHP, IntHP, DoubleHP, LogHP, CategoricalHP]),
]


def _type_name(annotation: Any) -> str:
    """A short readable name for a field's type."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation) if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        return annotation.__name__
    return re.sub(r"\btyping\.", "", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section defaults)"
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value in ((), {}, []):
        return "empty"
    if value == "":
        return '`""`'
    return f"`{value}`"


def _rows(model: type[BaseModel]) -> list[str]:
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        text = (field.description or "").replace("|", "\\|")
        lines.append(f"| `{name}` | {_type_name(field.annotation)} | {_default(field)} | {text} |")
    return lines


def _model_doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


def _subsections() -> list[tuple[str, type[BaseModel]]]:
    """The top-level keys whose value is a section of its own (resources, optimizations, ...)."""
    found = []
    for name, field in ExperimentConfig.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found.append((name, annotation))
    return found


def render_reference() -> str:
    """The whole reference as Markdown."""
    out = [_HEADER.format(depth=MAX_DEPTH, nodes=MAX_NODES, count=MAX_GRID_COUNT, points=MAX_GRID_POINTS)]
    out += ["## Top-level keys", "", _model_doc(ExperimentConfig), "", *_rows(ExperimentConfig), ""]
    for name, model in _subsections():
        out += [f"## `{name}`", "", _model_doc(model), "", *_rows(model), ""]
    for key, intro, models in _SECTIONS:
        out += [f"## `{key}`", "", intro, ""]
        for model in models:
            tag = model.model_fields.get("name") or model.model_fields.get("type")
            title = tag.default if tag is not None and isinstance(tag.default, str) else model.__name__
            out += [f"### `{title}`", "", _model_doc(model), "", *_rows(model), ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_reference())
