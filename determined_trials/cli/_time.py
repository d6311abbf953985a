"""Where a trial's (or an experiment's trials') wall time went, as ``describe`` prints it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TextIO

from determined_trials.core.store import TIME_PARTS

__all__ = ["write_time"]

_ROWS = (*TIME_PARTS, "other", "wall")


def write_time(out: TextIO, time: Mapping[str, float], title: str) -> None:
    """A ``title`` line, then each part's seconds and share of the wall (and the goodput when ``time`` has it)."""
    wall = time.get("wall", 0.0)
    out.write(f"\n{title}:\n")
    for part in _ROWS:
        share = f"{100.0 * time.get(part, 0.0) / wall:6.1f} %" if wall > 0 else ""
        out.write(f"  {part + ':':<12} {time.get(part, 0.0):>10.2f} s {share}\n")
    if "goodput" in time:
        out.write(f"  {'goodput:':<12} {100.0 * time['goodput']:>10.1f} %  (train / wall)\n")
