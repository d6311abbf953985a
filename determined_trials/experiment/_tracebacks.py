"""A failing trial's traceback as the runner shows it on the terminal: your code's frames, under the paths
of your own files (not the snapshot copy's), and the exception line; a traceback shown before for the same
trial is one line. The trial's log file keeps every line as the trial printed it."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path

__all__ = ["SOURCE_FILE", "TracebackCondenser"]

SOURCE_FILE = "context_dir"
"""In an experiment's folder: the context directory the user gave ``experiment create`` (its snapshot's source)."""

_HEADER = "Traceback (most recent call last):"
_PREFIX = re.compile(r"^((?:\[trial \d+\] )?(?:\[rank=\d+\] )?)(.*)$")
_FRAME = re.compile(r'^  File "(?P<path>[^"]+)", line \d+')


@dataclasses.dataclass
class _Block:
    """The lines of one traceback being read (from its header up to its exception line)."""

    lines: list[str] = dataclasses.field(default_factory=list)


class TracebackCondenser:
    """Wraps one trial's ``echo``: other lines pass through; a traceback is held until its exception line,
    then shown as your frames (all frames when none is yours: a harness error hides nothing) and the
    exception line. The same traceback again (a restart failing the same way) is its exception line alone."""

    def __init__(self, echo: Callable[[str], None], *, snapshot: Path, source: Path | None, log_name: str) -> None:
        self._echo = echo
        self._snapshot = snapshot.resolve()
        self._source = source
        self._log_name = log_name
        self._open: dict[str, _Block] = {}  # output prefix ([trial N] [rank=R] ) -> the traceback it is printing
        self._shown: set[tuple[str, ...]] = set()

    @classmethod
    def for_trial(cls, echo: Callable[[str], None], *, exp_dir: Path, model_dir: Path,
                  trial_id: int) -> TracebackCondenser:
        """The condenser of one trial of the experiment in ``exp_dir`` (snapshot ``model_dir``)."""
        source_file = exp_dir / SOURCE_FILE
        source = Path(source_file.read_text().strip()) if source_file.is_file() else None
        return cls(echo, snapshot=model_dir, source=source, log_name=f"trial_{trial_id}.log")

    def __call__(self, line: str) -> None:
        match = _PREFIX.match(line)
        prefix, text = (match.group(1), match.group(2)) if match else ("", line)
        block = self._open.get(prefix)
        if block is None:
            if text == _HEADER:
                self._open[prefix] = _Block([text])
            else:
                self._echo(line)
            return
        block.lines.append(text)
        if not text or text.startswith(" "):  # frames, source lines, carets
            return
        del self._open[prefix]  # the exception line ends the traceback
        self._show(prefix, block.lines)

    def flush(self) -> None:
        """Show what is held of tracebacks whose exception line never came (the process died mid-way)."""
        for prefix, block in list(self._open.items()):
            del self._open[prefix]
            for text in block.lines:
                self._echo(prefix + text)

    def _show(self, prefix: str, lines: list[str]) -> None:
        frames = _frames(lines[1:-1])
        own = [[self._rewrite(frame[0]), *frame[1:]] for frame in frames if self._is_own(frame[0])]
        shown = own or frames
        key = (*(text for frame in shown for text in frame), lines[-1])
        if key in self._shown:
            self._echo(f"{prefix}{lines[-1]}  (the same traceback as before; every line is in {self._log_name})")
            return
        self._shown.add(key)
        header = (f"Traceback (most recent call last; your code's frames, every frame is in {self._log_name}):"
                  if own and len(own) < len(frames) else _HEADER)
        for text in [header, *(text for frame in shown for text in frame), lines[-1]]:
            self._echo(prefix + text)

    def _is_own(self, frame_line: str) -> bool:
        path = _frame_path(frame_line)
        return path is not None and _inside(path, self._snapshot)

    def _rewrite(self, frame_line: str) -> str:
        """The frame's snapshot path as the path of the user's own file (relative to here when below it)."""
        path = _frame_path(frame_line)
        if path is None or self._source is None:
            return frame_line
        original = self._source / path.resolve().relative_to(self._snapshot)
        shown = os.path.relpath(original) if _inside(original, Path.cwd()) else str(original)
        return frame_line.replace(f'"{path}"', f'"{shown}"', 1)


def _frames(lines: list[str]) -> list[list[str]]:
    """Group a traceback's body into frames: each ``File ...`` line with the indented lines after it."""
    frames: list[list[str]] = []
    for text in lines:
        if _FRAME.match(text) or not frames:
            frames.append([text])
        else:
            frames[-1].append(text)
    return frames


def _frame_path(frame_line: str) -> Path | None:
    match = _FRAME.match(frame_line)
    return Path(match.group("path")) if match else None


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except (ValueError, OSError):
        return False
    return True
