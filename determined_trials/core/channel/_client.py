"""The store channel's trial side: ``RemoteStore`` forwards a trial's store calls to the runner's
``StoreChannelServer``; ``open_store`` picks it when the runner handed the trial a channel token."""

from __future__ import annotations

import enum
import os
import pickle
import threading
from pathlib import Path
from typing import Any, cast

import zmq

from determined_trials.core.channel._server import ALLOWED_METHODS, LOG_METHOD, ChannelToken
from determined_trials.core.store import LocalStore, NotFoundError, dumps

__all__ = ["STORE_CHANNEL_ENV", "ChannelError", "RemoteStore", "open_store"]

STORE_CHANNEL_ENV = "DET_STORE_CHANNEL"
_TIMEOUT_S = float(os.environ.get("DET_STORE_CHANNEL_TIMEOUT", "120"))
_ERRORS: dict[str, type[Exception]] = {"NotFoundError": NotFoundError, "ValueError": ValueError, "TypeError": TypeError}


class ChannelError(RuntimeError):
    """The runner's store channel did not answer (runner gone, network down, or a wrong token)."""


def _plain(value: Any) -> Any:
    """Enum members as their values, paths as text (what the store itself would accept)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


class RemoteStore:
    """The subset of ``LocalStore`` a trial process uses, served by the runner over the network.

    Each call is one request and one reply; a call without a reply within the timeout raises
    :class:`ChannelError` (nothing is retried, so nothing is recorded twice).
    """

    def __init__(self, token: ChannelToken, run_dir: str | os.PathLike[str], *, timeout_s: float = _TIMEOUT_S) -> None:
        self.token = token
        self.path = Path(run_dir)
        self._timeout_ms = int(timeout_s * 1000)
        self._lock = threading.Lock()
        self._pid = -1
        self._socket: zmq.Socket[bytes] | None = None

    def __repr__(self) -> str:
        return f"RemoteStore({self.token.address!r})"

    def _connected(self) -> zmq.Socket[bytes]:
        if self._pid != os.getpid() or self._socket is None:  # a forked child opens its own socket
            self._lock = threading.Lock()
            socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.REQ)
            socket.curve_serverkey = self.token.server_public.encode()
            socket.curve_publickey = self.token.client_public.encode()
            socket.curve_secretkey = self.token.client_secret.encode()
            socket.rcvtimeo = socket.sndtimeo = self._timeout_ms
            socket.linger = 0
            socket.connect(self.token.address)
            self._socket, self._pid = socket, os.getpid()
        return self._socket

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on the runner's store and return its result (or raise its error)."""
        body = dumps({"m": method, "a": [_plain(a) for a in args],
                      "kw": {k: _plain(v) for k, v in kwargs.items()}}, f"the arguments of {method}").encode()
        with self._lock:
            socket = self._connected()
            try:
                socket.send(body)
                reply = socket.recv()
            except zmq.Again:
                socket.close(linger=0)
                self._socket = None
                raise ChannelError(
                    f"the experiment runner's store at {self.token.address} did not answer {method} within "
                    f"{self._timeout_ms / 1000:.0f} s: the runner stopped, the network is down, or this "
                    "process's channel token is not the experiment's") from None
        answer = pickle.loads(reply)  # from the server this token authenticates (CURVE)
        if answer[0] == "ok":
            return answer[1]
        raise _ERRORS.get(answer[1], RuntimeError)(answer[2])

    def send_log(self, trial_id: int, lines: list[str]) -> None:
        """Hand lines of the trial's output to the runner (terminal and trial log)."""
        self.call(LOG_METHOD, trial_id=trial_id, lines=lines)

    def close(self) -> None:
        """Close this process's socket (reopened by the next call)."""
        with self._lock:
            if self._socket is not None and self._pid == os.getpid():
                self._socket.close(linger=0)
            self._socket = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in ALLOWED_METHODS:
            raise AttributeError(f"{name!r}: trial processes reach the store over the channel, which serves "
                                 f"only {', '.join(sorted(ALLOWED_METHODS))}")
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)


def open_store(run_dir: str | os.PathLike[str]) -> LocalStore:
    """The store a trial process writes to: the runner's channel when ``$DET_STORE_CHANNEL`` holds its
    token (trials on other machines), else the run folder's SQLite file."""
    token = os.environ.get(STORE_CHANNEL_ENV)
    if token:
        return cast(LocalStore, RemoteStore(ChannelToken.loads(token), run_dir))
    return LocalStore(run_dir)
