"""The benchmarks' measure of how long ``Trainer.fit``'s training thread is held by checkpoints: the loop's
``Checkpointer.save`` and ``poll`` timed while a ``with CheckpointTimer()`` block runs."""

from __future__ import annotations

import time
from typing import Any

from determined_trials.loop import _checkpointing

__all__ = ["CheckpointTimer"]


class CheckpointTimer:
    """Wall time the training thread spends in Checkpointer.save / poll (the first save apart), and in
    the final save: its wait for the write in flight, then its own write."""

    def __init__(self) -> None:
        self.blocked, self.calls, self.first, self.final_wait, self.final = 0.0, 0, -1.0, 0.0, 0.0
        cls = _checkpointing.Checkpointer
        self._originals = {name: getattr(cls, name) for name in ("save", "poll")}

    def __enter__(self) -> CheckpointTimer:
        cls = _checkpointing.Checkpointer
        for name, original in self._originals.items():
            setattr(cls, name, self._timed(original, name == "save"))
        return self

    @property
    def per_checkpoint(self) -> float:
        """Mean seconds held per checkpoint taken while training went on (0 when none was)."""
        return self.blocked / max(1, self.calls)

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(_checkpointing.Checkpointer, name, original)

    def _timed(self, original: Any, counts: bool) -> Any:
        def timed(checkpointer: Any, *args: Any, **kwargs: Any) -> Any:
            final = bool(kwargs.get("final"))
            if final:  # the end of fit: first the write in flight, then this one, written at once
                start = time.perf_counter()
                checkpointer.wait()
                self.final_wait += time.perf_counter() - start
            start = time.perf_counter()
            try:
                return original(checkpointer, *args, **kwargs)
            finally:
                took = time.perf_counter() - start
                if final:
                    self.final += took
                else:
                    self.blocked += took
                    self.calls += counts
                    if counts and self.first < 0:
                        self.first = took

        return timed
