"""How the runner shows a failing trial's traceback (issue 25, item 6): your frames under your own paths,
the exception line, and a repeat as one line; every other line passes through unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from determined_trials.experiment._tracebacks import TracebackCondenser


def _traceback(snapshot: Path, prefix: str = "[trial 1] [rank=0] ", error: str = "ValueError: boom") -> list[str]:
    body = [
        "Traceback (most recent call last):",
        '  File "/venv/determined_trials/loop/_controller.py", line 102, in run',
        "    reason = self._train(shape)",
        "             ^^^^^^^^^^^^^^^^^^",
        f'  File "{snapshot / "model_def.py"}", line 22, in train_batch',
        '    return {"loss": helper(batch)}',
        f'  File "{snapshot / "lib" / "util.py"}", line 6, in helper',
        '    raise ValueError("boom")',
        error,
    ]
    return [prefix + line for line in body]


@pytest.fixture
def shown(tmp_path: Path) -> tuple[list[str], TracebackCondenser, Path]:
    snapshot = tmp_path / "runs" / "experiments" / "1" / "model"
    (snapshot / "lib").mkdir(parents=True)
    lines: list[str] = []
    return lines, TracebackCondenser(lines.append, snapshot=snapshot, source=tmp_path / "mine",
                                     log_name="trial_1.log"), snapshot


def test_only_your_frames_under_your_paths_then_the_exception(shown: tuple[list[str], TracebackCondenser, Path],
                                                              tmp_path: Path) -> None:
    lines, condenser, snapshot = shown
    for line in ["[trial 1] [rank=0] starting", *_traceback(snapshot)]:
        condenser(line)
    mine = tmp_path / "mine"
    assert lines == [
        "[trial 1] [rank=0] starting",
        "[trial 1] [rank=0] Traceback (most recent call last; your code's frames, every frame is in trial_1.log):",
        f'[trial 1] [rank=0]   File "{mine / "model_def.py"}", line 22, in train_batch',
        '[trial 1] [rank=0]     return {"loss": helper(batch)}',
        f'[trial 1] [rank=0]   File "{mine / "lib" / "util.py"}", line 6, in helper',
        '[trial 1] [rank=0]     raise ValueError("boom")',
        "[trial 1] [rank=0] ValueError: boom",
    ]


def test_the_same_traceback_again_is_one_line(shown: tuple[list[str], TracebackCondenser, Path]) -> None:
    lines, condenser, snapshot = shown
    for line in _traceback(snapshot) + _traceback(snapshot) + _traceback(snapshot, error="KeyError: 'x'"):
        condenser(line)
    assert lines.count("[trial 1] [rank=0] ValueError: boom") == 1
    assert lines.count("[trial 1] [rank=0] ValueError: boom  (the same traceback as before; every line is in "
                       "trial_1.log)") == 1
    assert lines[-1] == "[trial 1] [rank=0] KeyError: 'x'" and sum("Traceback" in line for line in lines) == 2


def test_a_traceback_with_none_of_your_frames_is_shown_whole(shown: tuple[list[str], TracebackCondenser, Path]) -> None:
    lines, condenser, _ = shown
    harness_only = ["Traceback (most recent call last):", '  File "/venv/determined_trials/x.py", line 1, in f',
                    "    g()", "RuntimeError: harness bug"]
    for line in harness_only:
        condenser(line)
    assert lines == harness_only


def test_ranks_interleaved_are_read_apart(shown: tuple[list[str], TracebackCondenser, Path]) -> None:
    lines, condenser, snapshot = shown
    zero, one = _traceback(snapshot, "[rank=0] "), _traceback(snapshot, "[rank=1] ", "KeyError: 'y'")
    for a, b in zip(zero, one):
        condenser(a)
        condenser(b)
    for rank, error in ((0, "ValueError: boom"), (1, "KeyError: 'y'")):
        mine = [line.removeprefix(f"[rank={rank}] ") for line in lines if line.startswith(f"[rank={rank}] ")]
        assert len(mine) == 6 and mine[0].startswith("Traceback (most recent call last; your code's frames")
        assert mine[1].endswith("line 22, in train_batch") and mine[-1] == error


def test_a_traceback_cut_short_is_shown_as_it_came_at_the_end(shown: tuple[list[str], TracebackCondenser, Path]) -> None:
    lines, condenser, snapshot = shown
    cut = _traceback(snapshot)[:4]
    for line in cut:
        condenser(line)
    assert lines == []
    condenser.flush()
    assert lines == cut


def test_without_the_source_the_snapshot_paths_stay(tmp_path: Path) -> None:
    snapshot = tmp_path / "model"
    (snapshot / "lib").mkdir(parents=True)
    lines: list[str] = []
    condenser = TracebackCondenser(lines.append, snapshot=snapshot, source=None, log_name="trial_1.log")
    for line in _traceback(snapshot, prefix=""):
        condenser(line)
    assert f'  File "{snapshot / "model_def.py"}", line 22, in train_batch' in lines
    assert not any("determined_trials" in line for line in lines)
