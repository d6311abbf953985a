"""Top-level names Determined's scripts use at import time: ``LOG_FORMAT`` and ``import_from_path``."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

__all__ = ["LOG_FORMAT", "import_from_path"]

LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"
"""A ``logging.basicConfig(format=...)`` that shows the process, for multi-process logs."""


@contextlib.contextmanager
def import_from_path(path: str | os.PathLike[str]) -> Iterator[None]:
    """Import modules from the folder ``path`` inside the ``with`` block, e.g. a checkpoint's ``code/``.

    Modules imported inside are forgotten afterwards (``sys.modules`` is put back), so a
    ``model_def`` of a checkpoint does not replace, or get replaced by, the one already imported.
    """
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"import_from_path: {folder!r} is not a folder")
    saved_modules = dict(sys.modules)
    saved_path = list(sys.path)
    for name in [n for n in sys.modules if _module_from(sys.modules[n], folder) is False]:
        sys.modules.pop(name)  # same-named modules from elsewhere would shadow the folder's
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path[:] = saved_path
        sys.modules.clear()
        sys.modules.update(saved_modules)


def _module_from(module: object, folder: str) -> bool | None:
    """Whether ``module`` is a top-level file module whose name also exists in ``folder`` (False: it
    is from elsewhere and must be hidden), else None."""
    name = getattr(module, "__name__", "")
    file = getattr(module, "__file__", None)
    if not file or "." in name:
        return None
    candidates = (os.path.join(folder, f"{name}.py"), os.path.join(folder, name, "__init__.py"))
    if not any(os.path.exists(c) for c in candidates):
        return None
    return os.path.abspath(file) in {os.path.abspath(c) for c in candidates} or False
