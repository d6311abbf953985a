"""wrap_rank: per-rank line prefixes on stdout and stderr, exit codes, the rank spec, signal forwarding
and the launch-folder records; the line a failure report names."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from determined_trials.launch._lines import LinePump, RecentLines, failure_reason

WRAP = [sys.executable, "-m", "determined_trials.launch.wrap_rank"]


def _wrap(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WRAP, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_prefixes_stdout_and_stderr_lines_and_passes_the_exit_code() -> None:
    out = _wrap("3", "--", *_py("""
        import sys
        sys.stdout.write("one\\ntwo\\r\\nprogress 1\\rprogress 2\\rlast without newline")
        sys.stderr.write("err 1\\n\\nerr 2\\n")
        sys.exit(7)
    """))
    assert out.returncode == 7
    assert out.stdout.splitlines() == [
        "[rank=3] one", "[rank=3] two", "[rank=3] progress 1", "[rank=3] progress 2", "[rank=3] last without newline",
    ]
    assert out.stdout.endswith("\n")
    assert out.stderr.splitlines() == ["[rank=3] err 1", "[rank=3] ", "[rank=3] err 2"]


def test_splits_long_lines() -> None:
    out = _wrap("0", *_py("print('x' * 20000)"))
    lines = out.stdout.splitlines()
    assert [len(line) - len("[rank=0] ") for line in lines] == [8192, 8192, 20000 - 2 * 8192]
    assert all(line.startswith("[rank=0] x") for line in lines)


def test_line_endings_split_across_reads() -> None:
    sink = io.BytesIO()
    pump = LinePump(os.open(os.devnull, os.O_RDONLY), sink, b"> ", RecentLines())
    for chunk in (b"a\r", b"\nb\r", b"c\n", b"d", b"e\r\n\n", b"tail"):
        pump.feed(chunk)
    pump.finish()
    assert sink.getvalue().decode().splitlines() == ["> a", "> b", "> c", "> de", "> ", "> tail"]


def test_a_child_killed_by_a_signal_gives_128_plus_n() -> None:
    out = _wrap("0", *_py("import os, signal; os.kill(os.getpid(), signal.SIGTERM)"))
    assert out.returncode == 128 + signal.SIGTERM


def test_rank_from_the_first_set_variable_of_a_list() -> None:
    out = _wrap("NOT_SET_HERE,MY_RANK", "--", *_py("print('hi')"), env={"MY_RANK": "5", "NOT_SET_HERE": ""})
    assert (out.returncode, out.stdout) == (0, "[rank=5] hi\n")


def test_no_rank_variable_set_is_a_clear_error() -> None:
    out = _wrap("NOT_SET_A,NOT_SET_B", *_py("print('never')"))
    assert out.returncode == 1
    assert "none of the environment variables NOT_SET_A, NOT_SET_B is set" in out.stderr
    assert "never" not in out.stdout


def test_usage_errors() -> None:
    assert _wrap("0").returncode == 2
    bad = _wrap("0", "definitely-not-a-command-xyz")
    assert bad.returncode == 127 and "cannot run 'definitely-not-a-command-xyz'" in bad.stderr


def test_no_redirect_keeps_the_rank_prefix() -> None:
    """--no-redirect-stdio concerns a container's log files only (issue 8, item 9): lines keep their prefix."""
    for args in (["--no-redirect-stdio", "1"], ["1", "--no-redirect-stdio"]):
        out = _wrap(*args, *_py("import sys; print('plain'); print('oops', file=sys.stderr)"))
        assert (out.returncode, out.stdout, out.stderr) == (0, "[rank=1] plain\n", "[rank=1] oops\n")


def test_launch_dir_records_pid_and_result(tmp_path: Path) -> None:
    out = _wrap("2", *_py("""
        import os, sys
        print("pid", os.getpid())
        for i in range(30):
            print("line", i)
        sys.exit(3)
    """), env={"DET_LAUNCH_DIR": str(tmp_path)})
    assert out.returncode == 3
    child_pid = int(out.stdout.splitlines()[0].split()[-1])
    assert (tmp_path / "rank-2.pid").read_text().strip() == str(child_pid)
    record = json.loads((tmp_path / "rank-2.json").read_text())
    assert record["rank"] == 2 and record["exit_code"] == 3
    assert record["last_lines"] == [f"line {i}" for i in range(10, 30)]


def test_a_signal_to_the_group_reaches_the_child_exactly_once(tmp_path: Path) -> None:
    child = _py("""
        import signal, sys, time
        got = []
        signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
        print("ready", flush=True)
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # time for a duplicate to arrive
        print("count", len(got), flush=True)
    """)
    proc = subprocess.Popen([*WRAP, "0", *child], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "[rank=0] ready\n"
        os.killpg(proc.pid, signal.SIGUSR1)  # what torchrun does to a worker: signal its whole group
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0
    assert rest == "[rank=0] count 1\n"


@pytest.mark.parametrize(("lines", "reason"), [
    (["Traceback (most recent call last):", '  File "t.py", line 3, in f', "RuntimeError: boom in batch 3",
      "terminate called without an active exception"], "RuntimeError: boom in batch 3"),
    (["  raise x", "torch.distributed.DistBackendError: peer closed", ""], "torch.distributed.DistBackendError: peer closed"),
    (["Traceback (most recent call last):", "KeyboardInterrupt"], "KeyboardInterrupt"),
    (["Segmentation fault", "  "], "Segmentation fault"),
    ([], "(no output)"),
])
def test_the_failure_reason_is_the_last_exception_line_else_the_last_line(lines: list[str], reason: str) -> None:
    assert failure_reason(lines) == reason
