"""The warm parent of a local experiment's trial processes (``main([SPEC, FD])``,
run by ``_warm``): it imports torch, this package and the trial's model_def once, then forks one process per trial.

Run by ``_warm`` with one end of a ``SOCK_SEQPACKET`` socket pair as FD. It says first, one JSON message,
``{"ready": [files]}`` (the model_def's files it imported from its folder, with their sha256) or
``{"cold": reason}`` (then it exits: the runner starts that trial family cold). Then each message it gets
is a trial to start, ``{"args", "env", "cwd"}`` with the write end of the trial's output pipe attached; it
answers ``{"pid": N}`` and, when that process ends, ``{"exit": N, "code": C}`` (``Popen.returncode``'s
meaning). It holds no thread, socket (but the pair), store connection or CUDA context, so a fork is safe;
a model_def whose import starts a thread (Python's or native: ``/proc/self/task``) makes it say ``cold``.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

__all__ = ["file_digest", "main"]

_MAX_MESSAGE = 1 << 20
# What a PyTorchTrial imports lazily before its first batch (an optimizer's first step; the store's TensorBoard
# scalars, never TensorFlow), imported here too: none starts a thread.
_LAZY_IMPORTS = ("torch._dynamo", "tensorboard.compat.proto.event_pb2", "tensorboard.compat.proto.summary_pb2",
                 "tensorboard.summary.writer.record_writer")
# Libraries model_defs often import whose import starts native threads that are safe across a fork: scipy's
# OpenBLAS pool (OpenBLAS shuts its pool down before a fork and starts it again when next used) and the jemalloc
# background thread scikit-learn's import starts (jemalloc's fork hooks). Imported, when installed, before the
# threads are counted, so a model_def importing them still starts warm.
_FORK_SAFE_POOLS = ("scipy.linalg", "sklearn")


def file_digest(path: str) -> str:
    """The sha256 of a file's bytes ("" when it cannot be read)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _warm_up(spec_text: str, folder: Path) -> dict[str, Any]:
    """Import what every trial imports, then the model_def; what to tell the runner."""
    import torch  # the point: imported once, shared by every forked trial

    import determined_trials.launch.harness  # noqa: F401
    from determined_trials import pytorch  # noqa: F401
    from determined_trials.launch import import_trial_class, parse_trial_spec

    for name in (*_LAZY_IMPORTS, *_FORK_SAFE_POOLS):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    base = _native_threads()  # torch's, numpy's and the pools above reset themselves at fork: allowed
    try:
        import_trial_class(parse_trial_spec(spec_text, folder))
    except BaseException as exc:  # noqa: BLE001 - the trial shows its own import error, cold
        return {"cold": f"importing {spec_text} failed ({type(exc).__name__}); its trials start cold"}
    if torch.cuda.is_initialized():
        return {"cold": f"importing {spec_text} initializes CUDA, which a fork cannot copy; its trials start cold"}
    if threading.active_count() > 1 or _native_threads() > base:
        return {"cold": f"importing {spec_text} starts a thread, which a fork cannot copy; its trials start "
                        "cold (`resources: {warm_processes: false}` skips the attempt)"}
    inside = str(folder.resolve()) + os.sep
    paths = [Path(f) for f in (getattr(m, "__file__", None) for m in list(sys.modules.values())) if isinstance(f, str)]
    files = sorted({str(p.resolve()) for p in paths if p.is_absolute() and str(p.resolve()).startswith(inside)})
    return {"ready": [[path, file_digest(path)] for path in files]}


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def _run_trial(request: dict[str, Any], out_fd: int, closing: list[int], preexec: Any, started: int) -> None:
    """In the forked child: become the trial process the runner would have started, run the harness, exit."""
    code: Any = 1
    try:
        os.setsid()  # a process group of its own: the runner's signals reach it and its children
        preexec()  # SIGTERM when the warm parent dies (it dies with the runner)
        os.close(started)  # the group exists: the parent may give the runner the pid
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a new interpreter has them
        for fd in closing:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(null)
        os.close(out_fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["determined_trials.launch.harness", *request["args"]]
        from determined_trials.launch import harness

        code = harness.main(request["args"])
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - a cold process prints its traceback and exits 1 too
        traceback.print_exc()
        code = 1
    finally:
        os._exit(_interpreter_exit(code))


def _interpreter_exit(code: Any) -> int:
    """What the interpreter does at its end, for a forked child: wait for non-daemon threads, run atexit,
    flush; the exit status of ``sys.exit(code)``."""
    try:
        shutdown = getattr(threading, "_shutdown", None)  # thread pools' exit hooks, then non-daemon threads
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        print(code, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return status


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _fork(request: dict[str, Any], out_fd: int, closing: list[int], preexec: Any) -> int:
    """Fork the trial's process; its pid once it is in a session of its own (so the runner can signal it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    started_r, started_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(started_r)
        _run_trial(request, out_fd, closing, preexec, started_w)
    os.close(started_w)
    os.close(out_fd)
    os.read(started_r, 1)  # b"" once the child closed its end (or died)
    os.close(started_r)
    return pid


def _serve(sock: socket.socket) -> None:
    """Fork a trial per request, report each one's exit; return when the runner closes its end."""
    from determined_trials.launch import die_with_parent

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    preexec = die_with_parent(signal.SIGTERM)
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(sock)
        if sock.fileno() in readable:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 1)
            if not data:
                return
            _send(sock, {"pid": _fork(json.loads(data), fds[0], [sock.fileno(), wake_r, wake_w], preexec)})


def main(argv: list[str]) -> int:
    """``SPEC FD``: warm up, tell the runner, serve forks until it closes the socket."""
    spec_text, fd = argv[0], int(argv[1])
    sock = socket.socket(fileno=fd)
    state = _warm_up(spec_text, Path.cwd())
    _send(sock, state)
    if "ready" in state:
        _serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
