"""The callback order rule: user callbacks run in registration order, each hook on every callback.

The harness's own services (reporting, checkpoint upload) run after the user callbacks because
the controller calls them after ``HookRunner.call`` returns.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

__all__ = ["HookRunner"]

logger = logging.getLogger("determined_trials.loop")


class HookRunner:
    """Calls one hook on every callback, in the order they were registered."""

    def __init__(self, callbacks: Mapping[str, Any]) -> None:
        self.callbacks = dict(callbacks)

    def call(self, hook: str, *args: Any, **kwargs: Any) -> None:
        """Run ``hook(*args, **kwargs)`` on each callback that has it."""
        for name, callback in self.callbacks.items():
            method = getattr(callback, hook, None)
            if method is None:
                continue
            try:
                method(*args, **kwargs)
            except Exception as err:
                if hasattr(err, "add_note"):  # Python 3.11+: say where it happened, keep the type
                    err.add_note(f"raised by callback {name!r} in {hook}()")
                raise

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

