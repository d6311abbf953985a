"""`load_config`: read YAML (a file or text) or a mapping and validate it into an ExperimentConfig."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeGuard, Union

import yaml
from pydantic import ValidationError

from determined_trials.config._errors import problems_from_validation, raise_problems
from determined_trials.config._schema import ExperimentConfig
from determined_trials.errors import ConfigError

__all__ = ["ConfigSource", "load_config"]

ConfigSource = Union[str, "os.PathLike[str]", Mapping[str, Any], ExperimentConfig]


MAX_DEPTH = 64  # nesting levels of a config
MAX_NODES = 100_000  # values in a config, aliases expanded


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, keeps timestamps as strings (JSON-able) and refuses
    nesting deeper than ``MAX_DEPTH`` while composing (before PyYAML's recursion could overflow)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise ConfigError(f"nesting deeper than {MAX_DEPTH} levels at line {line}; a config needs far "
                                  "fewer: flatten it")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        try:
            duplicate = key in seen
        except TypeError:  # unhashable key: let PyYAML report it
            continue
        if duplicate:
            raise ConfigError(
                f"duplicate key {key!r} at line {line} (first at line {seen[key]}); keep only one of them"
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except ConfigError as exc:
        raise ConfigError(f"Invalid experiment configuration in {source}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(
            f"Invalid experiment configuration in {source}: YAML syntax error{where}: {problem}. "
            "Check the indentation, colons and quoting on that line and the one before it."
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"Invalid experiment configuration in {source}: YAML error: {exc}") from None


def _looks_like_path(text: str) -> bool:
    stripped = text.strip()
    return "\n" not in stripped and ": " not in stripped and not stripped.startswith(("{", "-"))


def _read_text(path: Path) -> str:
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ConfigError(
            f"Experiment configuration file '{path}' {what} (looked from {Path.cwd()}). "
            "Fix: pass the path of a YAML file, a YAML string, or a dict."
        )
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Cannot read experiment configuration file '{path}': {exc}") from None


@dataclasses.dataclass
class _FileRead:
    """The last config file read: its text, its parse and, once asked for, its validated config."""

    text: str
    raw: Any
    config: ExperimentConfig | None = None


_last_file: _FileRead | None = None


def _file_read(text: str, source: str) -> _FileRead:
    """The file's parse, reusing the last one of the very same text: the experiment runner's warm parent reads
    the experiment's config once, and each trial process it forks reads the same file (PyYAML's pure-Python
    parser takes ~20 ms a config, validating it again in a forked process ~6 ms)."""
    global _last_file
    if _last_file is None or _last_file.text != text:
        _last_file = _FileRead(text, _parse_yaml(text, source))
    return _last_file


def _is_path(source: object) -> TypeGuard[str | os.PathLike[str]]:
    return isinstance(source, os.PathLike) or (isinstance(source, str) and _looks_like_path(source))


def load_raw(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The unvalidated top-level mapping of a source, and a name for it in messages."""
    origin: str | None = None
    if isinstance(source, Mapping):
        raw: Any = source
    elif _is_path(source):
        origin = str(Path(source))
        raw = copy.deepcopy(_file_read(_read_text(Path(source)), origin).raw)
    elif isinstance(source, str):
        raw, origin = _parse_yaml(source, "YAML text"), "YAML text"
    else:
        raise ConfigError(
            f"Cannot load an experiment configuration from {type(source).__name__}; pass a path to a "
            "YAML file, a YAML string, a dict, or an ExperimentConfig."
        )
    return _checked_mapping(raw, origin), origin


def _checked_mapping(raw: Any, origin: str | None) -> dict[str, Any]:
    """``raw`` as the top-level mapping of a config, within the budget; ``ConfigError`` otherwise."""
    _check_budget(raw, origin)
    if not isinstance(raw, Mapping):
        kind = "nothing (empty document)" if raw is None else type(raw).__name__
        where = f" in {origin}" if origin else ""
        raise ConfigError(
            f"Invalid experiment configuration{where}: the top level must be a mapping of keys "
            f"(name, hyperparameters, searcher, ...), got {kind}. Fix: write `key: value` lines at "
            "the top level, e.g. `searcher: {name: single, metric: validation_loss}`."
        )
    return dict(raw)


def _check_budget(raw: Any, origin: str | None) -> None:
    """At most ``MAX_DEPTH`` levels and ``MAX_NODES`` values, counting shared values (YAML aliases,
    a dict reused in a dict) each time they appear: what validation would walk. Iterative and
    stopping at the bound, so an alias bomb or a 10,000-level nesting is refused at once."""
    where = f" in {origin}" if origin else ""
    stack: list[tuple[Any, int]] = [(raw, 1)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise ConfigError(f"Invalid experiment configuration{where}: more than {MAX_NODES:,} values (YAML "
                              "aliases expanded); is it an alias bomb? Write the values out or shorten it.")
        if depth > MAX_DEPTH:
            raise ConfigError(f"Invalid experiment configuration{where}: nesting deeper than {MAX_DEPTH} "
                              "levels; a config needs far fewer: flatten it")
        if isinstance(value, Mapping):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value)


def validate_raw(raw: Mapping[str, Any], origin: str | None = None) -> ExperimentConfig:
    """Validate a top-level mapping, raising ConfigError with every problem found."""
    try:
        return ExperimentConfig.model_validate(dict(raw))
    except ValidationError as exc:
        raise_problems(problems_from_validation(exc, ExperimentConfig), source=origin)


def load_config(source: ConfigSource) -> ExperimentConfig:
    """Parse and validate an experiment configuration, once.

    `source` is a path to a YAML file (str or PathLike), YAML text, a mapping, or an already
    parsed `ExperimentConfig` (returned as is). Raises `ConfigError` listing every problem.
    Cluster-only keys (bind_mounts, workspace, ...) are dropped with a `ConfigWarning`.
    """
    if isinstance(source, ExperimentConfig):
        return source
    if not _is_path(source):
        return validate_raw(*load_raw(source))
    origin = str(Path(source))
    read = _file_read(_read_text(Path(source)), origin)
    if read.config is None:
        read.config = validate_raw(_checked_mapping(copy.deepcopy(read.raw), origin), origin)
    return copy.deepcopy(read.config)
