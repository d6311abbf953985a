"""The launch folder (``$DET_LAUNCH_DIR``) a launcher shares with its workers: each rank's pid and
exit record, and the marker a preempted harness leaves."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from determined_trials.core import LAUNCH_DIR_ENV, PREEMPTED_MARKER
from determined_trials.errors import PREEMPTED_EXIT_CODE

__all__ = [
    "LAUNCH_DIR_ENV",
    "PREEMPTED_EXIT_CODE",
    "PREEMPTED_MARKER",
    "RankResult",
    "is_ready",
    "launch_dir",
    "mark_preempted",
    "mark_ready",
    "read_failure_times",
    "read_pids",
    "read_results",
    "was_preempted",
    "write_failure",
    "write_pid",
    "write_result",
]

_RANK_FILE = re.compile(r"^rank-(\d+)\.(pid|json|failed)$")


@dataclasses.dataclass(frozen=True)
class RankResult:
    """How one rank's command ended: its exit code, its last output lines, and when."""

    rank: int
    exit_code: int
    last_lines: list[str]
    ended_at: float = 0.0


def launch_dir() -> Path | None:
    """The launch folder named by ``$DET_LAUNCH_DIR``, or None outside a launcher."""
    raw = os.environ.get(LAUNCH_DIR_ENV)
    return Path(raw) if raw else None


def _write_atomic(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(text)
    os.replace(staging, path)


def write_pid(folder: Path, rank: int, pid: int) -> None:
    """Record the pid of ``rank``'s command (the process a launcher signals for a preemption)."""
    _write_atomic(folder / f"rank-{rank}.pid", f"{pid}\n")


def write_result(folder: Path, result: RankResult) -> None:
    """Record how ``result.rank``'s command ended."""
    _write_atomic(folder / f"rank-{result.rank}.json", json.dumps(dataclasses.asdict(result)))


def _rank_files(folder: Path, kind: str) -> dict[int, Path]:
    found: dict[int, Path] = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in folder.iterdir():
            match = _RANK_FILE.match(entry.name)
            if match and match.group(2) == kind:
                found[int(match.group(1))] = entry
    return found


def read_pids(folder: Path) -> dict[int, int]:
    """{rank: pid} of the commands started so far."""
    pids: dict[int, int] = {}
    for rank, path in _rank_files(folder, "pid").items():
        with contextlib.suppress(OSError, ValueError):
            pids[rank] = int(path.read_text().strip())
    return pids


def read_results(folder: Path) -> dict[int, RankResult]:
    """{rank: result} of the commands that have ended."""
    results: dict[int, RankResult] = {}
    for rank, path in _rank_files(folder, "json").items():
        with contextlib.suppress(OSError, ValueError, TypeError):
            raw: dict[str, Any] = json.loads(path.read_text())
            results[rank] = RankResult(**raw)
    return results


def mark_preempted(folder: Path) -> None:
    """Leave the marker that tells the launcher the job stopped for a preemption (resumable)."""
    _write_atomic(folder / PREEMPTED_MARKER, "preempted\n")


def was_preempted(folder: Path) -> bool:
    """Whether some rank left the preemption marker."""
    return (folder / PREEMPTED_MARKER).exists()


def mark_ready(folder: Path, pid: int) -> None:
    """Say that process ``pid`` now handles a preemption signal (until then a launcher holds it back)."""
    _write_atomic(folder / f"ready-{pid}", "")


def is_ready(folder: Path, pid: int) -> bool:
    """Whether process ``pid`` said it handles a preemption signal."""
    return (folder / f"ready-{pid}").exists()


def write_failure(folder: Path, rank: int, error: str) -> None:
    """Record when ``rank`` hit an error (the launcher names the rank that failed first)."""
    _write_atomic(folder / f"rank-{rank}.failed", json.dumps({"time": time.time(), "error": error}))


def read_failure_times(folder: Path) -> dict[int, float]:
    """{rank: when it hit an error} for the ranks that recorded one."""
    times: dict[int, float] = {}
    for rank, path in _rank_files(folder, "failed").items():
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            times[rank] = float(json.loads(path.read_text())["time"])
    return times
