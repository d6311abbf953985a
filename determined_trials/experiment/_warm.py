"""Warm trial processes: the local executor's warm parents (``_zygote``), one per trial spec and model
folder, and the forked trial process as ``TrialProcess`` sees it (a ``Popen`` look-alike)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from determined_trials.experiment._launch import _DROPPED_ENV, CONFIG_ENV
from determined_trials.experiment._zygote import file_digest
from determined_trials.experiment._zygote_fork import MAX_MESSAGE
from determined_trials.launch import LEGACY_ENTRYPOINT, die_with_parent

__all__ = ["WarmParents", "preflight_ahead", "warm_parent_ahead", "warm_spec"]

_READY_TIMEOUT_S = 600.0  # importing torch and a model_def on a loaded machine
# not `-m`: the experiment package imports the module before runpy would run it. The collector is off while it
# imports (~20 % of importing torch); ``_zygote`` freezes what it imported, then turns it on.
_ZYGOTE_MAIN = ("import gc, sys; gc.disable(); from determined_trials.experiment._zygote import main; "
                "sys.exit(main(sys.argv[1:]))")


def warm_spec(entrypoint: Any, slots: int) -> str | None:
    """The ``model_def:Class`` a trial runs, when it can start warm: the legacy entrypoint on one slot
    (which the launcher runs as one harness process); None otherwise (a script, a launcher, several ranks)."""
    if slots != 1 or not isinstance(entrypoint, str) or not LEGACY_ENTRYPOINT.match(entrypoint.strip()):
        return None
    return entrypoint.strip()


class _ForkedChild:
    """A trial process forked by a warm parent, with the part of ``subprocess.Popen`` TrialProcess uses."""

    def __init__(self, parent: _WarmParent, pid: int, stdout: IO[bytes]) -> None:
        self._parent, self.pid, self.stdout = parent, pid, stdout

    def poll(self) -> int | None:
        """The exit status once it ended, else None."""
        return self._parent.exit_code(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        """Block until it ended (``subprocess.TimeoutExpired`` after ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"trial process {self.pid}", timeout or 0.0)
            with self._parent.changed:
                self._parent.changed.wait(0.1)
        return code


class _WarmParent:
    """One warm parent process: started, imported, forking trials on request."""

    def __init__(self) -> None:
        """Start it: it imports torch and this package, then waits for ``begin``."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env["PYTHONUNBUFFERED"] = "1"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE_MAIN, str(theirs.fileno())],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),), start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM),
        )
        theirs.close()
        self._sock = ours
        self.changed = threading.Condition()
        self._exits: dict[int, int] = {}
        self._pids: list[int] = []
        self._on_exit: dict[int, Callable[[], None]] = {}
        self._alive = True
        self.files: dict[str, str] = {}
        self.cold_reason: str | None = None
        self._begun = False

    def preflight(self, args: list[str], cwd: Path, timeout: float) -> tuple[int, str, str] | None:
        """Before ``begin``: ``experiment._preflight``'s check of ``args`` in ``cwd``, run in a child forked from this
        parent (once it imported torch): (exit status, stdout, stderr); None when it is gone;
        ``subprocess.TimeoutExpired`` past ``timeout`` (it is ended then)."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            message = json.dumps({"preflight": args, "cwd": str(cwd)}).encode()
            self._sock.settimeout(timeout)
            try:
                socket.send_fds(self._sock, [message], [out.fileno(), err.fileno()])
                reply = self._sock.recv(MAX_MESSAGE)
            except TimeoutError:
                self.close()
                raise subprocess.TimeoutExpired("the preflight check", timeout) from None
            except OSError:
                return None
            self._sock.settimeout(None)
            if not reply:
                return None
            out.seek(0)
            err.seek(0)
            return int(json.loads(reply)["code"]), out.read().decode(errors="replace"), err.read().decode(
                errors="replace")

    def begin(self, spec: str, model_dir: Path, log_path: Path, config_path: str) -> None:
        """Import the trial spec's model_def in ``model_dir`` (output to ``log_path``); then it forks trials,
        unless ``cold_reason`` says why it cannot."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._begun = True
        self._sock.settimeout(_READY_TIMEOUT_S)
        try:
            with open(log_path, "ab") as log:
                message = {"spec": spec, "folder": str(model_dir), "config": config_path}
                socket.send_fds(self._sock, [json.dumps(message).encode()], [log.fileno()])
        except OSError as exc:
            self.cold_reason = f"the warm parent did not start ({type(exc).__name__})"
            self.close()
            return
        self._ready()

    def _ready(self) -> None:
        try:
            first = json.loads(self._sock.recv(MAX_MESSAGE) or b'{"cold": "the warm parent ended"}')
        except (OSError, ValueError) as exc:
            first = {"cold": f"the warm parent did not start ({type(exc).__name__})"}
        if "ready" not in first:
            self.cold_reason = str(first.get("cold"))
            self.close()
            return
        self.files = dict(first["ready"])
        self._sock.settimeout(None)
        threading.Thread(target=self._listen, name="det-warm-parent", daemon=True).start()

    def _listen(self) -> None:
        try:
            while data := self._sock.recv(MAX_MESSAGE):
                message = json.loads(data)
                with self.changed:
                    if "exit" in message:
                        self._exits[message["exit"]] = message["code"]
                        self._on_exit.pop(message["exit"], lambda: None)()
                    else:
                        self._pids.append(int(message.get("pid", -1)))
                    self.changed.notify_all()
        except OSError:
            pass
        with self.changed:
            self._alive = False
            self.changed.notify_all()
            waiting, self._on_exit = list(self._on_exit.values()), {}
        for on_exit in waiting:  # orphaned: their ends are found by pid from now on
            on_exit()

    def fresh(self) -> bool:
        """Whether it still runs and the files it imported are unchanged."""
        return self._alive and all(file_digest(path) == digest for path, digest in self.files.items())

    def fork(self, args: list[str], env: dict[str, str], cwd: Path,
             on_exit: Callable[[], None]) -> _ForkedChild | None:
        """A trial process forked with this command line, environment and folder (``on_exit`` is called, on the
        listener's thread, once the parent reports its exit); None if it is gone."""
        read_fd, write_fd = os.pipe()
        try:
            with self.changed:
                socket.send_fds(self._sock, [json.dumps({"args": args, "env": env, "cwd": str(cwd)}).encode()],
                                [write_fd])
                while not self._pids and self._alive:
                    self.changed.wait()
                pid = self._pids.pop(0) if self._pids else -1
                if pid > 0:
                    self._on_exit[pid] = on_exit
        except OSError:
            pid = -1
        finally:
            os.close(write_fd)
        if pid <= 0:
            os.close(read_fd)
            return None
        return _ForkedChild(self, pid, os.fdopen(read_fd, "rb"))

    def exit_code(self, pid: int) -> int | None:
        """A forked trial's exit status, once it ended. If the warm parent died first, the process was
        orphaned: ended (status unknown, 1) once its pid is gone."""
        with self.changed:
            if pid in self._exits or self._alive:
                return self._exits.get(pid)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return 1
        return None

    def close(self) -> None:
        """Close the socket: the warm parent ends (its running trials get SIGTERM, as for a killed runner); one
        never begun (maybe still importing) is killed: it has nothing to finish."""
        if not self._begun:
            self._proc.kill()
        try:  # shut down first: a close alone leaves the listener's recv blocked and the parent sees no end
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # it ended already
            pass
        self._sock.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


_ahead: list[_WarmParent] = []  # started by ``warm_parent_ahead``, taken by the first ``WarmParents.fork`` needing one


@contextlib.contextmanager
def warm_parent_ahead(start: bool) -> Iterator[None]:
    """With ``start``, a warm parent starts importing torch and this package now, while the experiment is set up
    (and the preflight imports the model_def beside it); the executor's first warm parent is that one. Ended on
    leaving the block if nothing took it."""
    if start:
        _ahead.append(_WarmParent())
    try:
        yield
    finally:
        while _ahead:
            _ahead.pop().close()


def preflight_ahead(args: list[str], cwd: Path, timeout: float) -> tuple[int, str, str] | None:
    """``_WarmParent.preflight`` in the warm parent started ahead (``warm_parent_ahead``); None without one."""
    return _ahead[0].preflight(args, cwd, timeout) if _ahead else None


class WarmParents:
    """The warm parents of one executor, by (spec, model folder); a spec that cannot start warm says so
    once (``warn``) and starts cold from then on."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._parents: dict[tuple[str, Path], _WarmParent] = {}
        self._cold: set[tuple[str, Path]] = set()

    def fork(self, spec: str, model_dir: Path, env: dict[str, str], log_dir: Path,
             on_exit: Callable[[], None] = lambda: None) -> _ForkedChild | None:
        """The trial process, forked warm (``on_exit``: called once its exit status is known); None: start it cold."""
        key = (spec, model_dir)
        if key in self._cold:
            return None
        parent = self._parents.get(key)
        if parent is not None and not parent.fresh():  # an edited model_def (or a dead parent): import again
            parent.close()
            parent = None
        if parent is None:
            parent = _ahead.pop() if _ahead else _WarmParent()
            parent.begin(spec, model_dir, log_dir / "warm_parent.log", env.get(CONFIG_ENV, ""))
            if parent.cold_reason is not None:
                self._cold.add(key)
                self._warn(f"warm trial processes: {parent.cold_reason}")
                return None
            self._parents[key] = parent
        return parent.fork(["--trial", spec], env, model_dir, on_exit)

    def close(self) -> None:
        """End every warm parent; idempotent."""
        for parent in self._parents.values():
            parent.close()
        self._parents.clear()
