"""Turn a child's output stream into whole lines with a prefix: ``\\n``, ``\\r\\n`` and a lone ``\\r``
each end a line, over-long lines are cut, and the last few lines are kept for a failure report."""

from __future__ import annotations

import collections
import os
import re
import threading
from typing import BinaryIO

__all__ = ["MAX_LINE_BYTES", "LinePump", "RecentLines", "failure_reason"]

MAX_LINE_BYTES = 8192
_LINE_END = re.compile(rb"\r\n|\r|\n")
# A Python exception's last line: its (dotted) class name, e.g. "RuntimeError: ..." or "torch.x.DistError: ..."
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)(?::|$)")


def failure_reason(lines: list[str]) -> str:
    """The line of a failed child's last lines that says why: its last Python exception line (a dying
    process may print more after it, e.g. C++'s "terminate called without an active exception" at exit),
    else its last line."""
    kept = [line.strip() for line in lines if line.strip()]
    for line in reversed(kept):
        if _EXCEPTION_LINE.match(line):
            return line
    return kept[-1] if kept else "(no output)"


class RecentLines:
    """The last ``size`` lines written by any of a child's streams (thread-safe)."""

    def __init__(self, size: int = 20) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, line: bytes) -> None:
        text = line.decode("utf-8", errors="replace")
        with self._lock:
            self._lines.append(text)

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self._lines)


class LinePump:
    """Copies one pipe to ``out`` line by line, each line prefixed; run ``start()``, then ``join()``."""

    def __init__(
        self, fd: int, out: BinaryIO, prefix: bytes, recent: RecentLines, max_line: int = MAX_LINE_BYTES
    ) -> None:
        self._fd = fd
        self._out = out
        self._prefix = prefix
        self._recent = recent
        self._max_line = max_line
        self._partial = b""
        self._after_cr = False
        self._thread = threading.Thread(target=self._run, name=f"line-pump-{fd}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the end of the stream; False when it is still open after ``timeout``."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def feed(self, data: bytes) -> None:
        """Split ``data`` (the next bytes of the stream) into lines and write the complete ones."""
        start = 1 if self._after_cr and data.startswith(b"\n") else 0  # "\r" | "\n" split across reads
        for match in _LINE_END.finditer(data, start):
            self._emit(self._partial + data[start:match.start()])
            self._partial = b""
            start = match.end()
        self._after_cr = data.endswith(b"\r")
        self._partial += data[start:]
        while len(self._partial) >= self._max_line:
            self._emit(self._partial[: self._max_line])
            self._partial = self._partial[self._max_line :]

    def finish(self) -> None:
        """The stream ended: write the unterminated last line, if any."""
        if self._partial:
            self._emit(self._partial)
            self._partial = b""

    def _emit(self, line: bytes) -> None:
        for start in range(0, max(len(line), 1), self._max_line):
            piece = line[start : start + self._max_line]
            self._recent.add(piece)
            try:
                self._out.write(self._prefix + piece + b"\n")
                self._out.flush()
            except (OSError, ValueError):  # our own output is gone; keep draining the child
                pass

    def _run(self) -> None:
        try:
            while True:
                try:
                    data = os.read(self._fd, 65536)
                except OSError:
                    break
                if not data:
                    break
                self.feed(data)
            self.finish()
        finally:
            os.close(self._fd)
