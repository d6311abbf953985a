"""determined_trials: Determined's trial APIs (PyTorchTrial, DeepSpeedTrial, TFKerasTrial) run locally.

``import determined_trials as det`` then ``det.core.init()``, ``det.pytorch.PyTorchTrial`` and so on.
Framework packages (``pytorch``, ``deepspeed``, ``keras``) are imported on first use, so this import
needs no framework; they are not in ``__all__``, so ``from determined_trials import *`` costs no more
than this import (``dir()`` still lists them).

May import: errors, _info, _compat, _format, config, core.*, loop, _trial_context,
searcher, pytorch.*, deepspeed, keras, testing, launch, experiment.*, cli
"""

from __future__ import annotations

import importlib
from typing import Any

from determined_trials import core
from determined_trials._compat import LOG_FORMAT, import_from_path
from determined_trials._info import ClusterInfo, TrialInfo, get_cluster_info
from determined_trials._trial_context import TrialContext
from determined_trials.errors import CollectiveError, ConfigError, InvalidHP

__all__ = [
    "ClusterInfo",
    "CollectiveError",
    "ConfigError",
    "InvalidHP",
    "LOG_FORMAT",
    "TrialContext",
    "TrialInfo",
    "core",
    "get_cluster_info",
    "import_from_path",
]

__version__ = "0.1.0"

_LAZY_SUBPACKAGES = ("pytorch", "deepspeed", "keras", "launch", "loop", "testing", "config")


def __getattr__(name: str) -> Any:
    """Import framework subpackages on first access (``det.pytorch`` imports torch only then)."""
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(f"determined_trials.{name}")
    raise AttributeError(f"module 'determined_trials' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names and the lazy subpackages (not yet imported, so not yet in ``globals()``)."""
    return sorted({*globals(), *_LAZY_SUBPACKAGES})
