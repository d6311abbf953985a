"""What a person sees on rank 0: a progress bar (tqdm) and a one-line summary per report."""

from __future__ import annotations

import os
import sys
from typing import Any

from tqdm import tqdm

__all__ = ["Progress", "progress_enabled", "summary_line"]

PROGRESS_ENV = "DET_PROGRESS"


def progress_enabled(requested: bool | None, is_chief: bool) -> bool:
    """The bar shows on the chief: as asked, else per ``$DET_PROGRESS`` (0/1), else on a terminal."""
    if not is_chief:
        return False
    if requested is not None:
        return requested
    env = os.environ.get(PROGRESS_ENV)
    if env is not None:
        return env.strip().lower() not in ("0", "false", "no", "off", "")
    return sys.stderr.isatty()


def summary_line(kind: str, batches: int, epochs: int, metrics: dict[str, Any]) -> str:
    """E.g. ``[training] batch 500 (epochs completed: 2): loss=0.1234 accuracy=0.9512``: ``epochs`` counts
    whole epochs trained, which "epoch 2" would leave open (the second, or two done?)."""
    shown = " ".join(f"{key}={_short(value)}" for key, value in metrics.items() if key not in ("batches", "epochs"))
    return f"[{kind}] batch {batches} (epochs completed: {epochs}): {shown}"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return f"[{len(value)} values]"
    return str(value)


class Progress:
    """A progress bar over the total number of batches, updated at boundaries only (never per batch)."""

    def __init__(self, *, enabled: bool, summaries: bool, total: int | None, initial: int) -> None:
        self._summaries = summaries
        self._bar = tqdm(total=total, initial=initial, unit="batch", dynamic_ncols=True) if enabled else None
        self._position = initial

    def advance_to(self, batches: int) -> None:
        """Move the bar to ``batches`` trained."""
        if self._bar is not None:
            self._bar.update(batches - self._position)
        self._position = batches

    def set_total(self, total: int) -> None:
        """Change the total (e.g. a searcher operation extends the length)."""
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def say(self, line: str) -> None:
        """Print a summary line (above the bar when there is one)."""
        if not self._summaries:
            return
        if self._bar is not None:
            self._bar.write(line)
        else:
            sys.stdout.write(line + "\n")  # one write (print writes the newline apart when unbuffered)
            sys.stdout.flush()

    def close(self) -> None:
        """Close the bar; idempotent."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
