"""The callback order rule: user callbacks run in registration order, each hook on every callback.

The harness's own services (reporting, checkpoint upload) run after the user callbacks because
the controller calls them after ``HookRunner.call`` returns.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["HookRunner"]

logger = logging.getLogger("determined_trials.loop")

# Hooks whose old form took no argument; such callbacks are still called, without it, with a warning.
_LEGACY_NO_ARGUMENT = frozenset({"on_training_epoch_start"})


class HookRunner:
    """Calls one hook on every callback, in the order they were registered."""

    def __init__(self, callbacks: Mapping[str, Any]) -> None:
        self.callbacks = dict(callbacks)
        self._legacy: dict[tuple[str, str], bool] = {}

    def call(self, hook: str, *args: Any, **kwargs: Any) -> None:
        """Run ``hook(*args, **kwargs)`` on each callback that has it."""
        for name, callback in self.callbacks.items():
            method = getattr(callback, hook, None)
            if method is None:
                continue
            try:
                if hook in _LEGACY_NO_ARGUMENT and self._takes_no_argument(name, hook, method):
                    method()
                else:
                    method(*args, **kwargs)
            except Exception as err:
                if hasattr(err, "add_note"):  # Python 3.11+: say where it happened, keep the type
                    err.add_note(f"raised by callback {name!r} in {hook}()")
                raise

    def _takes_no_argument(self, name: str, hook: str, method: Any) -> bool:
        """Whether ``method`` is the old no-argument form of ``hook`` (checked once; warns once)."""
        key = (name, hook)
        if key not in self._legacy:
            try:
                params = list(inspect.signature(method).parameters.values())
            except (TypeError, ValueError):
                params = []
            kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                     inspect.Parameter.VAR_POSITIONAL)
            positional = [p for p in params if p.kind in kinds]
            self._legacy[key] = legacy = not positional
            if legacy:
                warnings.warn(f"callback {name!r}: {hook}(self) without the epoch_idx argument is deprecated; "
                              f"define {hook}(self, epoch_idx)", FutureWarning, stacklevel=4)
        return self._legacy[key]

    def state_dict(self) -> dict[str, Any]:
        """Each callback's ``state_dict()`` by name (callbacks without one are left out)."""
        return {name: cb.state_dict() for name, cb in self.callbacks.items() if hasattr(cb, "state_dict")}

    def load_state_dict(self, states: Mapping[str, Any]) -> None:
        """Give each callback its saved state; a callback with no saved state is told in a warning."""
        for name, callback in self.callbacks.items():
            if name in states and hasattr(callback, "load_state_dict"):
                callback.load_state_dict(states[name])
            elif name not in states and hasattr(callback, "load_state_dict"):
                logger.warning("callback %r has no saved state in the checkpoint; it starts fresh", name)

