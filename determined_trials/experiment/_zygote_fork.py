"""How a warm parent (``_zygote``) starts trial processes: ``serve_forks`` answers the runner's requests from a
spare process forked ahead of time (in a session of its own, waiting for its trial), and becomes, in that
process, the trial process the runner would have started as a new interpreter."""

from __future__ import annotations

import atexit
import gc
import json
import os
import select
import signal
import socket
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_MESSAGE", "send_message", "serve_forks"]

MAX_MESSAGE = 1 << 20  # the longest message either side of the runner's socket pair sends
_READY = b"r"  # a spare says it is in its session: its pid may go to the runner


class _Spare:
    """A process forked ahead, in a session of its own, waiting for the one trial it will run."""

    def __init__(self, closing: list[int], preexec: Callable[[], None]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            ours.close()
            _spare_main(theirs, closing, preexec)
        theirs.close()
        self.pid, self._sock = pid, ours

    def start(self, request: bytes, out_fd: int) -> socket.socket | None:
        """Give it its trial (the output pipe's write end attached); the socket on which the trial says its exit
        status, or None (it died unused)."""
        try:
            if self._sock.recv(1) == _READY:
                socket.send_fds(self._sock, [request], [out_fd])
                return self._sock
        except OSError:
            pass
        self._sock.close()
        return None

    def close(self) -> None:
        """It ends unused (its socket's end)."""
        self._sock.close()


def _spare_main(sock: socket.socket, closing: list[int], preexec: Callable[[], None]) -> None:
    """In the spare: detach, say ready, wait for the trial, run it, exit (never returns)."""
    code: Any = 1
    try:
        _detach(closing, preexec)
        sock.send(_READY)
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
        if not data:  # the warm parent ended: no trial for it
            os._exit(0)
        code = _run_trial(json.loads(data), fds[0])
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - a cold process prints its traceback and exits 1 too
        traceback.print_exc()
        code = 1
    finally:
        status = _interpreter_exit(code)
        _say_exit(sock, status)
        os._exit(status)


def _say_exit(sock: socket.socket, status: int) -> None:
    """Tell the warm parent the exit status now, its output closed, rather than once the kernel has torn the
    process down (~15 ms of a forked torch process's memory): the runner starts the next trial meanwhile. Not
    for a process that used CUDA: its device memory is free only at its real end."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return
    try:
        for fd in (0, 1, 2):
            os.close(fd)
        sock.send(bytes([status]))
    except OSError:
        pass


def _detach(closing: list[int], preexec: Callable[[], None]) -> None:
    """A session of its own (the runner's signals reach it and its children), SIGTERM when the warm parent dies
    (it dies with the runner), the signal handlers a new interpreter has, none of the parent's descriptors."""
    os.setsid()
    preexec()
    _disarm_inherited_finalizers()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in closing:
        os.close(fd)


def _run_trial(request: dict[str, Any], out_fd: int) -> Any:
    """Become the trial process the runner asked for (``{"args", "env", "cwd"}``, output to ``out_fd``) and run
    the harness; its exit code."""
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

    return harness.main(request["args"])


def _disarm_inherited_finalizers() -> None:
    """The ``weakref.finalize`` callbacks registered in the warm parent (torch.library's ~170 operator
    registrations, ~30 ms) are its own: the trial process does not run them at its exit (their objects are
    copies; one collected in the trial still runs its callback then, as usual)."""
    for finalizer in list(getattr(weakref.finalize, "_registry", {})):
        finalizer.atexit = False


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


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    """One JSON message to the runner."""
    sock.send(json.dumps(message).encode())


def serve_forks(sock: socket.socket) -> None:
    """Start a trial per request (``{"args", "env", "cwd"}``, the output pipe attached) and answer its pid; report
    each one's exit; return when the runner closes its end. A spare is forked after each start, while the trial
    runs, so the next request is answered without a fork (a spare that died is replaced, the request kept)."""
    _Server(sock).serve()


class _Server:
    """The warm parent's loop: requests from the runner, trials' exit statuses (said or reaped), spares."""

    def __init__(self, sock: socket.socket) -> None:
        from determined_trials.launch import die_with_parent

        self._sock = sock
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(wake_w)
        self._preexec = die_with_parent(signal.SIGTERM)
        self._closing = [sock.fileno(), self._wake_r, wake_w]
        self._trials: dict[int, tuple[int, socket.socket]] = {}  # end socket's fd -> (pid, end socket)
        self._said: set[int] = set()  # pids whose exit status was said before they were reaped
        gc.freeze()  # the collector never walks (writes to) what the parent made: fewer pages a trial copies
        self._spare = _Spare(self._closing, self._preexec)

    def serve(self) -> None:
        try:
            while True:
                readable, _, _ = select.select([self._sock.fileno(), self._wake_r, *self._trials], [], [])
                for fd in readable:
                    if fd in self._trials:
                        self._trial_ends(fd)
                if self._wake_r in readable:
                    os.read(self._wake_r, 4096)
                    self._reap()
                if self._sock.fileno() in readable and not self._start():
                    return
        finally:
            self._spare.close()

    def _start(self) -> bool:
        """Hand the runner's request to the spare; False when the runner closed its end."""
        data, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, 1)
        if not data:
            return False
        end = self._spare.start(data, fds[0])
        if end is None:  # it died unused: one made now
            self._spare = _Spare(self._closing, self._preexec)
            end = self._spare.start(data, fds[0])
        os.close(fds[0])
        if end is not None:
            self._trials[end.fileno()] = (self._spare.pid, end)
        send_message(self._sock, {"pid": self._spare.pid if end is not None else -1})  # -1: the runner starts it cold
        self._spare = _Spare(self._closing, self._preexec)
        return True

    def _trial_ends(self, fd: int) -> None:
        """The trial's end socket is readable (its exit status) or closed (or, from the reap, ended)."""
        pid, end = self._trials.pop(fd)
        try:
            said = end.recv(1, socket.MSG_DONTWAIT)
        except OSError:  # nothing (a child of the trial may hold the socket open)
            said = b""
        end.close()
        if said:  # else it died without a word (a signal, or it used CUDA): its exit status comes from the reap
            self._said.add(pid)
            send_message(self._sock, {"exit": pid, "code": said[0]})

    def _reap(self) -> None:
        """Report each ended trial process's exit status, unless said already (a spare that died unused is no
        trial: not reported)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for fd in [fd for fd, (trial_pid, _) in self._trials.items() if trial_pid == pid]:
                self._trial_ends(fd)  # a status it said after the select: read before deciding
            if pid in self._said:
                self._said.discard(pid)
            elif pid != self._spare.pid:
                send_message(self._sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
