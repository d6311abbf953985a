"""The store channel's runner side: a ZeroMQ reply service in front of the run folder's ``LocalStore``
for trial processes on other machines, authenticated with CURVE keys made for one experiment run."""

from __future__ import annotations

import dataclasses
import json
import pickle
import threading
from collections.abc import Callable
from typing import Any

import zmq
import zmq.auth.thread

from determined_trials.core.store import TRIAL_STORE_METHODS, LocalStore, NotFoundError

__all__ = ["ALLOWED_METHODS", "ChannelToken", "StoreChannelServer"]

ALLOWED_METHODS = TRIAL_STORE_METHODS  # what a trial process may call: the methods of the TrialStore contract
LOG_METHOD = "trial_log"  # not a store method: lines of a trial's output for the runner's terminal and log
_POLL_MS = 200


@dataclasses.dataclass(frozen=True)
class ChannelToken:
    """What a trial needs to reach the runner's store: the address, the server's public key and the
    client key pair (Z85 text). Whoever holds it may write to the experiment's store."""

    address: str
    server_public: str
    client_public: str
    client_secret: str

    def dumps(self) -> str:
        """The token as one line of JSON (for an environment variable)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def loads(cls, text: str) -> ChannelToken:
        """Parse ``dumps()``'s text; a malformed token is a ``ValueError``."""
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed store channel token ({exc}); it is set by the experiment runner") from exc


class _OneClientKey:
    """ZAP credentials callback: only the experiment's client public key may connect."""

    def __init__(self, allowed: bytes) -> None:
        self._allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        """``key``: the connecting client's public key, Z85-encoded."""
        return bool(key == self._allowed)


LogSink = Callable[[int, list[str]], None]


class StoreChannelServer:
    """Serves ``store`` on ``tcp://host:port`` (a free port when 0) from a thread until ``close()``."""

    def __init__(self, store: LocalStore, *, host: str = "127.0.0.1", bind: str = "0.0.0.0", port: int = 0,
                 log_sink: LogSink | None = None) -> None:
        """``host``: the address trials connect to; ``bind``: the interface listened on."""
        self._store = store
        self._log_sink = log_sink
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        self._ctx = zmq.Context()
        self._auth = zmq.auth.thread.ThreadAuthenticator(self._ctx)
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=_OneClientKey(client_public))
        self._socket = self._ctx.socket(zmq.ROUTER)
        self._socket.curve_server = True
        self._socket.curve_secretkey = server_secret
        self._socket.curve_publickey = server_public
        self._socket.linger = 0
        if port:
            self._socket.bind(f"tcp://{bind}:{port}")
        else:
            port = self._socket.bind_to_random_port(f"tcp://{bind}")
        self.token = ChannelToken(f"tcp://{host}:{port}", server_public.decode(), client_public.decode(),
                                  client_secret.decode())
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="det-store-channel", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not dict(poller.poll(_POLL_MS)):
                continue
            frames = self._socket.recv_multipart()
            ident, body = frames[0], frames[-1]
            answer = self._answer(body)
            self.requests += 1  # before the reply: a caller that has its answer sees its request counted
            self._socket.send_multipart([ident, b"", answer])

    def _answer(self, body: bytes) -> bytes:
        try:
            request = json.loads(body)
            result = self._call(str(request["m"]), list(request.get("a", [])), dict(request.get("kw", {})))
            return pickle.dumps(("ok", result))
        except Exception as exc:  # the trial re-raises it
            kind = next((k.__name__ for k in (NotFoundError, ValueError, TypeError) if isinstance(exc, k)),
                        "RuntimeError")
            return pickle.dumps(("error", kind, str(exc.args[0]) if exc.args else str(exc)))

    def _call(self, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if method == LOG_METHOD:
            if self._log_sink is not None:
                self._log_sink(int(kwargs["trial_id"]), [str(line) for line in kwargs["lines"]])
            return None
        if method not in ALLOWED_METHODS:
            raise ValueError(f"the store channel does not serve {method!r}: a trial process may call only "
                             "the TrialStore methods (determined_trials.core.store)")
        return getattr(self._store, method)(*args, **kwargs)

    def close(self) -> None:
        """Stop serving and release the port; idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=30)
        self._socket.close(linger=0)
        self._auth.stop()
        self._ctx.term()

    def __enter__(self) -> StoreChannelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
