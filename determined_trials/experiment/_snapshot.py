"""Snapshot a context directory into the run folder: `.detignore` (gitignore syntax), no byte-code,
no run folder (the active one or any other: a folder holding ``store.sqlite``), and a size limit, so
later edits do not change a running experiment."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pathspec

from determined_trials.core.store import STORE_FILENAME

__all__ = ["DEFAULT_MAX_CONTEXT_BYTES", "DETIGNORE", "ContextTooLargeError", "context_files", "snapshot_context"]

DETIGNORE = ".detignore"
DEFAULT_MAX_CONTEXT_BYTES = 95 * 1024 * 1024
_ALWAYS_IGNORED = ("__pycache__/", "*.pyc", "*.pyo")


class ContextTooLargeError(ValueError):
    """The context directory holds more bytes than the limit allows."""


def _ignore_spec(context_dir: Path) -> pathspec.PathSpec:
    lines = list(_ALWAYS_IGNORED)
    ignore_file = context_dir / DETIGNORE
    if ignore_file.is_file():
        lines += ignore_file.read_text(encoding="utf-8").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _inside(path: Path, folders: list[Path]) -> bool:
    return any(path == f or path.is_relative_to(f) for f in folders)


def _is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` is a run folder (it holds a store): its runs and checkpoints are not code."""
    return (folder / STORE_FILENAME).is_file()


def context_files(
    context_dir: str | os.PathLike[str], *, exclude: list[Path] | None = None, left_out: list[Path] | None = None,
) -> Iterator[Path]:
    """Relative paths of the files a snapshot of ``context_dir`` takes, in a stable order.

    ``exclude``: absolute folders never taken (the run folder, when it lies inside the context). Run
    folders (holding ``store.sqlite``) are never taken either; ``left_out`` gets their relative paths.
    """
    root = Path(context_dir).resolve()
    spec = _ignore_spec(root)
    skip = [Path(p).resolve() for p in exclude or []]
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        rel_dir = here.relative_to(root)
        kept_dirs = []
        for name in sorted(dirs):
            rel = (rel_dir / name).as_posix()
            if _inside(here / name, skip) or spec.match_file(rel + "/"):
                continue
            if _is_run_folder(here / name):
                if left_out is not None:
                    left_out.append(Path(rel))
                continue
            kept_dirs.append(name)
        dirs[:] = kept_dirs
        for name in sorted(files):
            rel = (rel_dir / name).as_posix()
            if not spec.match_file(rel) and not _inside(here / name, skip):
                yield Path(rel)


def snapshot_context(
    context_dir: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    exclude: list[Path] | None = None,
    max_bytes: int = DEFAULT_MAX_CONTEXT_BYTES,
    say: Callable[[str], None] | None = None,
) -> int:
    """Copy the context directory's files into ``dest`` (created); returns the bytes copied. Run
    folders inside the context are left out; ``say`` gets a line naming them.

    Raises ``ContextTooLargeError`` (before copying anything) when the files exceed ``max_bytes``.
    """
    root = Path(context_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"context directory {root} does not exist or is not a folder; pass the "
                                "folder that holds your training code")
    target = Path(dest).resolve()
    run_folders: list[Path] = []
    files = list(context_files(root, exclude=[*(exclude or []), target], left_out=run_folders))
    if run_folders and say is not None:
        names = ", ".join(sorted(f"{p.as_posix()}/" for p in run_folders))
        say(f"left out of the context snapshot: {names} (run folders: they hold {STORE_FILENAME})")
    sizes = {rel: (root / rel).stat().st_size for rel in files}
    total = sum(sizes.values())
    if total > max_bytes:
        largest = sorted(sizes, key=sizes.__getitem__, reverse=True)[:3]
        names = ", ".join(f"{p.as_posix()} ({sizes[p] / 2**20:.1f} MiB)" for p in largest)
        raise ContextTooLargeError(
            f"context directory {root} holds {total / 2**20:.1f} MiB, more than the limit of "
            f"{max_bytes / 2**20:.1f} MiB (largest: {names}); list data sets and other large files in "
            f"{root / DETIGNORE} (gitignore syntax) and load data from outside the context"
        )
    target.mkdir(parents=True, exist_ok=True)
    for rel in files:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target / rel, follow_symlinks=True)
    return total
