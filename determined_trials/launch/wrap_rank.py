"""``python -m determined_trials.launch.wrap_rank RANK_SPEC [--no-redirect-stdio] [--] CMD [ARGS...]``:
run CMD with every output line prefixed ``[rank=N] `` and its exit code passed through.

``--no-redirect-stdio`` is accepted as in Determined, where it only concerns the container's log
files; there are none locally, so lines keep their prefix either way.
RANK_SPEC is a number, or environment variable names separated by commas, tried in order (e.g.
``RANK`` under torchrun). SIGTERM, SIGINT, SIGUSR1, SIGUSR2 and SIGHUP are forwarded to CMD, each
delivery exactly once: CMD runs in its own process group, so a signal sent to wrap_rank's group does
not reach it twice, and it is killed if wrap_rank dies. Under a launcher (``$DET_LAUNCH_DIR`` set)
it records ``rank-N.pid`` (CMD's pid) at the start and ``rank-N.json`` (exit code, last lines) at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from determined_trials.core.transport import WRAP_RANK_PARENT_ENV, WRAP_RANK_PID_ENV
from determined_trials.launch._launch_dir import RankResult, launch_dir, write_pid, write_result
from determined_trials.launch._lines import LinePump, RecentLines
from determined_trials.launch._procs import die_with_parent, exit_code

__all__ = ["FORWARDED_SIGNALS", "main", "resolve_rank"]

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
_USAGE = "usage: python -m determined_trials.launch.wrap_rank RANK_SPEC [--no-redirect-stdio] [--] CMD [ARGS...]"
_PIPE_DRAIN_S = 2.0  # after CMD exits, how long its pipes may stay open (held by its own children)


class _UsageError(Exception):
    """A problem with the command line or the environment: message and exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def resolve_rank(spec: str) -> int:
    """The rank a RANK_SPEC names: the number itself, or the first set variable of a comma list."""
    text = spec.strip()
    if text.isdigit():
        return int(text)
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or not all(name.isidentifier() for name in names):
        raise _UsageError(f"wrap_rank: RANK_SPEC {spec!r} is neither a rank number nor a list of "
                          "environment variable names like RANK or HOROVOD_RANK,OMPI_COMM_WORLD_RANK", 2)
    for name in names:
        value = os.environ.get(name, "").strip()
        if not value:
            continue
        if not value.isdigit():
            raise _UsageError(f"wrap_rank: ${name}={value!r} is not a rank number", 1)
        return int(value)
    raise _UsageError(
        f"wrap_rank: none of the environment variables {', '.join(names)} is set, so the rank is unknown; "
        "run under a launcher that sets it (torchrun sets RANK) or pass the rank as a number", 1,
    )


def _parse(argv: Sequence[str]) -> tuple[str, bool, list[str]]:
    args = list(argv)
    redirect = True
    while args and args[0] == "--no-redirect-stdio":
        redirect, args = False, args[1:]
    if not args or args[0] in ("-h", "--help"):
        raise _UsageError(_USAGE, 0 if args else 2)
    spec, args = args[0], args[1:]
    while args and args[0] == "--no-redirect-stdio":
        redirect, args = False, args[1:]
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise _UsageError(f"{_USAGE}\nwrap_rank: error: no command to run", 2)
    return spec, redirect, args


class _Forwarder:
    """Forwards each signal it receives to the child; queues those that arrive before the child exists."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._pending: list[int] = []

    def install(self) -> None:
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, self._handle)

    def attach(self, pid: int) -> None:
        self._pid = pid
        while self._pending:
            self._send(self._pending.pop(0))

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._pid is None:
            self._pending.append(signum)
        else:
            self._send(signum)

    def _send(self, signum: int) -> None:
        assert self._pid is not None
        try:
            os.kill(self._pid, signum)
        except ProcessLookupError:
            pass


def _child_environment() -> dict[str, str]:
    """Our environment plus who we and our parent are: a rank under wrap_rank then derives its job
    key from our parent (the launcher), like its peers, instead of from its own wrap_rank."""
    return {**os.environ, WRAP_RANK_PID_ENV: str(os.getpid()), WRAP_RANK_PARENT_ENV: str(os.getppid())}


def _run(rank: int, cmd: list[str]) -> int:
    prefix = f"[rank={rank}] ".encode()
    recent = RecentLines()
    folder = launch_dir()
    forwarder = _Forwarder()
    forwarder.install()
    pipe = subprocess.PIPE
    try:
        child = subprocess.Popen(cmd, stdout=pipe, stderr=pipe, env=_child_environment(),
                                 preexec_fn=die_with_parent(signal.SIGKILL, new_group=True))
    except OSError as exc:
        message = f"wrap_rank: cannot run {cmd[0]!r}: {exc.strerror or exc}"
        recent.add(message.encode())
        sys.stderr.buffer.write(prefix + message.encode() + b"\n")
        status = 126 if isinstance(exc, PermissionError) else 127
        if folder is not None:
            write_result(folder, RankResult(rank, status, recent.snapshot(), time.time()))
        return status
    if folder is not None:
        write_pid(folder, rank, child.pid)
    forwarder.attach(child.pid)
    pumps = []
    assert child.stdout is not None and child.stderr is not None
    for stream, out in ((child.stdout, sys.stdout.buffer), (child.stderr, sys.stderr.buffer)):
        pumps.append(LinePump(os.dup(stream.fileno()), out, prefix, recent))
        stream.close()
    for pump in pumps:
        pump.start()
    status = exit_code(child.wait())
    deadline = time.monotonic() + _PIPE_DRAIN_S
    for pump in pumps:
        pump.join(max(0.0, deadline - time.monotonic()))
    if folder is not None:
        write_result(folder, RankResult(rank, status, recent.snapshot(), time.time()))
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    try:
        spec, _redirect, cmd = _parse(sys.argv[1:] if argv is None else argv)
        rank = resolve_rank(spec)
    except _UsageError as exc:
        print(exc, file=sys.stderr if exc.status else sys.stdout)
        return exc.status
    return _run(rank, cmd)


def _exit(status: int) -> None:
    """Exit at once: a signal arriving during interpreter shutdown would otherwise replace the status."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


if __name__ == "__main__":
    _exit(main())
