"""Top-level names Determined's scripts use at import time: ``LOG_FORMAT`` and ``import_from_path``; and how
a user's ``module:Class`` is found (``import_qualname``, ``resolve_qualname``: the launcher's and the
checkpoint loader's one importer of a trial class).

May import: nothing
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["LOG_FORMAT", "import_from_path", "import_qualname", "resolve_qualname"]

LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"
"""A ``logging.basicConfig(format=...)`` that shows the process, for multi-process logs."""


@contextlib.contextmanager
def import_from_path(path: str | os.PathLike[str]) -> Iterator[None]:
    """Import modules from the folder ``path`` inside the ``with`` block, e.g. a checkpoint's ``code/``.

    The folder's modules are forgotten afterwards and same-named modules imported before are put
    back, so a checkpoint's ``model_def`` does not replace, or get replaced by, the one in use.
    Other modules first imported inside the block (libraries) stay imported.
    """
    folder = os.path.abspath(os.fspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"import_from_path: {folder!r} is not a folder")
    hidden = {name: module for name, module in sys.modules.items() if _shadowed_by(name, module, folder)}
    for name in hidden:
        del sys.modules[name]  # else `import model_def` would return the one imported before
    saved_path = list(sys.path)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name in [n for n, m in sys.modules.items() if _inside(getattr(m, "__file__", None), folder)]:
            del sys.modules[name]
        sys.modules.update(hidden)


def _inside(file: str | None, folder: str) -> bool:
    return bool(file) and os.path.abspath(str(file)).startswith(folder + os.sep)


def _shadowed_by(name: str, module: object, folder: str) -> bool:
    """A module imported from elsewhere whose top-level name is also a module of ``folder``."""
    top = name.partition(".")[0]
    exists = os.path.exists(os.path.join(folder, f"{top}.py")) or os.path.isdir(os.path.join(folder, top))
    return exists and not _inside(getattr(module, "__file__", None), folder)


def import_qualname(module_name: str, qualname: str) -> Any:
    """The object at the dotted ``qualname`` of the module ``module_name`` (``ImportError`` or ``AttributeError``
    when there is none)."""
    return resolve_qualname(importlib.import_module(module_name), qualname)


def resolve_qualname(obj: Any, qualname: str) -> Any:
    """The attribute at the dotted ``qualname`` below ``obj`` (a module's ``Outer.Inner``); otherwise the
    ``AttributeError``, its ``name`` set to the prefix that is missing (``"Outer"`` or ``"Outer.Inner"``)."""
    parts = qualname.split(".")
    for index, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError as err:
            err.name = ".".join(parts[: index + 1])
            raise
    return obj
