"""tests/support/helpers_group_run.py: what a test runs with ``run_in_group`` leaves nothing behind, whether the
command ends, leaves a child running, or runs past its timeout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from support.helpers_group_run import run_in_group

# the parent writes its child's pid, then exits at once or hangs
SPAWNER = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
           "time.sleep(600)']); open(sys.argv[1], 'w').write(str(child.pid)); "
           "time.sleep(600 if sys.argv[2] == 'hang' else 0)")


def _gone(pid_file: Path) -> bool:
    child = psutil.Process(int(pid_file.read_text()))
    try:
        child.wait(timeout=60)
    except psutil.TimeoutExpired:
        child.kill()
        return False
    return True


def test_a_child_left_running_is_killed_when_the_command_ends(tmp_path: Path) -> None:
    proc = run_in_group([sys.executable, "-c", SPAWNER, str(tmp_path / "pid"), "exit"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _gone(tmp_path / "pid")


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_group([sys.executable, "-c", SPAWNER, str(pid_file), "hang"], timeout=10)
    if pid_file.exists() and pid_file.read_text():  # on a very loaded machine it may not have got that far
        assert _gone(pid_file)
