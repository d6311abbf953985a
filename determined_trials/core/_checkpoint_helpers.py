"""The checkpoint context's helpers: metadata checks and merging across ranks, the files a checkpoint
stores, reading one of its JSON files, and the outcomes ranks exchange about a step (an error that travels,
or a result)."""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from determined_trials.core.storage import METADATA_FILE, Selector, list_local_files

__all__ = ["Outcome", "attempt", "check_metadata", "checkpoint_files", "jsonable", "merge_plans", "portable",
           "read_json_file", "unwrap", "warn_metadata_replaced"]

logger = logging.getLogger("determined_trials.core")

_T = TypeVar("_T")
# What ranks exchange about a step: (the exception that stopped it, or None; its result).
Outcome = tuple[BaseException | None, Any]


def checkpoint_files(src: Path | None, selector: Selector | None) -> dict[str, int]:
    """The files to store from ``src`` ({relative path: size}); a top-level metadata.json is replaced."""
    if src is None:
        return {}
    files = list_local_files(src, selector)
    if files.pop(METADATA_FILE, None) is not None:
        warn_metadata_replaced(src)
    return files


def read_json_file(file: Path, missing: str) -> dict[str, Any]:
    """The JSON object in a checkpoint's ``file``; ``FileNotFoundError(missing)`` when the file is not there."""
    if not file.exists():
        raise FileNotFoundError(missing)
    loaded: dict[str, Any] = json.loads(file.read_text())
    return loaded


def warn_metadata_replaced(folder: Path) -> None:
    logger.warning("%s in %s is replaced by the checkpoint's own metadata", METADATA_FILE, folder)


def check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validated, JSON-normalised checkpoint metadata; it must hold ``steps_completed``."""
    fix = "pass metadata={'steps_completed': <batches trained so far>, ...}"
    if metadata is None:
        raise ValueError(f"checkpoint metadata is required and must include 'steps_completed'; {fix}")
    if not isinstance(metadata, Mapping):
        raise TypeError(f"checkpoint metadata must be a dict, got {type(metadata).__name__}; {fix}")
    if "steps_completed" not in metadata:
        raise ValueError(f"checkpoint metadata has no 'steps_completed' (keys: {sorted(metadata)}); {fix}")
    md = jsonable(metadata)
    steps = md["steps_completed"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"metadata['steps_completed'] must be an integer >= 0, got {steps!r}")
    return md


def jsonable(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """A JSON round trip of ``metadata`` (numpy/tensor scalars converted); ValueError if impossible."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"checkpoint metadata must be a dict, got {type(metadata).__name__}")
    try:
        result: dict[str, Any] = json.loads(json.dumps(dict(metadata), default=_json_default))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"checkpoint metadata must be JSON-serialisable: {exc}") from exc
    return result


def _json_default(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    raise TypeError(f"a value of type {type(value).__name__} is not JSON-serialisable ({value!r:.80})")


def merge_plans(plans: list[Outcome], storage_id: str) -> dict[str, Any]:
    """Check the ranks' plans (failures, clashing files) and merge their metadata (same on every rank)."""
    failed = [f"rank {r}: {exc}" for r, (exc, _) in enumerate(plans) if exc is not None]
    if failed:
        raise RuntimeError(f"checkpoint {storage_id} was not saved because {'; '.join(failed)}")
    owners: dict[str, list[int]] = {}
    for rank, (_, plan) in enumerate(plans):
        for rel in plan["files"]:
            owners.setdefault(rel, []).append(rank)
    clashes = [f"{rel!r} (ranks {', '.join(map(str, ranks))})" for rel, ranks in owners.items() if len(ranks) > 1]
    if clashes:
        more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
        raise RuntimeError(
            f"shard=True checkpoint {storage_id}: the same file was written by several ranks: "
            f"{', '.join(clashes[:5])}{more}; each file must come from exactly one rank (use rank-specific "
            "names, or let only one rank write shared files)"
        )
    merged: dict[str, Any] = {}
    sources: dict[str, int] = {}
    for rank, (_, plan) in enumerate(plans):
        _merge_metadata(merged, plan["metadata"], rank, sources, "")
    return check_metadata(merged)


def _merge_metadata(into: dict[str, Any], new: dict[str, Any], rank: int, sources: dict[str, int], path: str) -> None:
    for key, value in new.items():
        name = f"{path}{key}"
        if key not in into:
            into[key] = value
            sources[name] = rank
        elif isinstance(into[key], dict) and isinstance(value, dict):
            _merge_metadata(into[key], value, rank, sources, f"{name}.")
        elif into[key] != value:
            raise ValueError(
                f"checkpoint metadata key {name!r} differs between ranks: rank {sources.get(name, '?')} gave "
                f"{into[key]!r}, rank {rank} gave {value!r}; give the same value everywhere or set it on one rank"
            )


def attempt(fn: Callable[[], _T]) -> Outcome:
    """Run ``fn``; any failure is captured (not raised) so that it can be sent to the other ranks."""
    try:
        return (None, fn())
    except Exception as exc:  # noqa: BLE001 - forwarded to every rank and raised there
        return (portable(exc), None)


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (to travel to other ranks), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any pickling failure means "send the text instead"
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def unwrap(outcome: Outcome | None) -> Any:
    assert outcome is not None
    if outcome[0] is not None:
        raise outcome[0]
    return outcome[1]
