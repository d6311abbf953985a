"""The worker end of a collective star: a DEALER connected to the chief's ROUTER, which sends its part
of each collective, waits for the chief's answer and notices when the chief dies, closes or aborts."""

from __future__ import annotations

import collections
import math
import os
import secrets
import threading
from typing import Any

import zmq

from determined_trials.core.transport._common import (
    ABORT,
    BYE,
    FAIL,
    GRACE_S,
    HELLO,
    OPS,
    REJECT,
    SIGNAL,
    WELCOME,
    StarSpec,
    decode,
    encode,
    now,
    open_monitor,
    read_events,
    readable,
    tune,
    wait_ms,
)
from determined_trials.errors import CollectiveError

__all__ = ["WorkerEnd"]

_ORDER_HINT = "All ranks must call the same collectives in the same order."
_TIMEOUT_HINT = "Raise the limit with DistributedContext(timeout=...) or DET_COLLECTIVE_TIMEOUT."
_MARGIN_S = 2.0  # a worker waits a little longer than the chief, so the chief's better diagnosis wins
_LINGER_SIGNAL_MS = 2_000
_HELLO_AGAIN_S = 0.2


class WorkerEnd:
    """One worker's connection to the chief of a star."""

    def __init__(self, zctx: zmq.Context[Any], spec: StarSpec) -> None:
        self._spec = spec
        self._zctx = zctx
        self._owner = threading.get_ident()
        self._sock = zctx.socket(zmq.DEALER)
        tune(self._sock)
        self._sock.setsockopt(zmq.ROUTING_ID, f"{spec.index}:{os.getpid()}:{secrets.token_hex(4)}".encode())
        self._mon = open_monitor(self._sock, zmq.EVENT_DISCONNECTED)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._mon, zmq.POLLIN)
        self._seq = 0
        self._results: collections.deque[tuple[int, str, Any]] = collections.deque()
        self._control: collections.deque[tuple[str, Any]] = collections.deque()
        self._welcomed = False
        self._lost_at: float | None = None
        self._chief_closed = False
        self._abort: dict[str, str] | None = None
        self._problem: str | None = None
        self._error: str | None = None
        self._closed = False
        self._sock.connect(spec.endpoint)

    # -- start-up ---------------------------------------------------------------------------------

    def handshake(self, info: dict[str, Any]) -> Any:
        """Say hello to the chief (again every 0.2 s, in case the first went to a chief that was
        closing at the same address) and wait for its welcome; return the welcome's payload."""
        spec = self._spec
        hello = encode(0, HELLO, {"index": spec.index, "size": spec.size, "token": spec.token,
                                  "pid": os.getpid(), **info})
        deadline, again = now() + spec.timeout, 0.0
        while True:
            if self._control:
                kind, payload = self._control.popleft()
                if kind == WELCOME:
                    return payload
                self._raise(f"start-up failed on rank {spec.rank}: {payload}")
            if self._abort is not None or self._chief_closed or self._problem is not None:
                self._check("start-up", math.inf)
            if now() >= deadline:
                self._raise(
                    f"start-up failed on rank {spec.rank}: the chief ({spec.chief_label}) did not answer at "
                    f"{spec.endpoint} within {spec.timeout:g} s. Check that it is running and that every rank "
                    "uses the same job (DET_JOB_ID, or MASTER_ADDR/MASTER_PORT), size, chief_ip and port."
                )
            if now() >= again:
                self._send(hello)
                again = now() + _HELLO_AGAIN_S
            self._pump(wait_ms(deadline, again))

    # -- collectives ------------------------------------------------------------------------------

    def gather(self, stuff: Any) -> None:
        """Send this rank's part to the chief; does not wait."""
        seq, data = self._prepare("gather", stuff)
        self._pump(0)
        what = self._what("gather", seq)
        self._check(what, math.inf)
        if self._results and self._results[0][0] < seq:
            k, kind, _ = self._results.popleft()
            self._diverged(what, k, kind)
        self._send(data)

    def allgather(self, stuff: Any) -> list[Any]:
        """Send this rank's part, then wait for everyone's parts from the chief."""
        seq, data = self._prepare("allgather", stuff)
        self._send(data)
        result: list[Any] = self._wait_result("allgather", seq)
        return result

    def broadcast(self, stuff: Any = None) -> Any:
        """Wait for the chief's object (``stuff`` is ignored on workers)."""
        seq, data = self._prepare("broadcast", None)
        self._send(data)  # lets the chief check that this rank called broadcast too
        return self._wait_result("broadcast", seq)

    def send_signal(self) -> None:
        """Tell the chief, out of band, that this process received a preemption signal."""
        if self._closed:
            return
        message = encode(-1, SIGNAL, self._spec.rank)
        same_thread = threading.get_ident() == self._owner
        # sockets are not thread-safe: another thread sends through a socket of its own
        sock = self._sock if same_thread else self._zctx.socket(zmq.DEALER)
        try:
            if not same_thread:
                sock.connect(self._spec.endpoint)
            sock.send(message, zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the chief is gone: the next collective says so
        finally:
            if not same_thread:
                sock.close(linger=_LINGER_SIGNAL_MS)

    def close(self) -> None:
        """Tell the chief this rank is done, then close the sockets; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pump(0)
        linger = 0
        if self._lost_at is None and not self._chief_closed:
            try:
                self._sock.send(encode(self._seq, BYE, None), zmq.NOBLOCK)
                linger = 500
            except zmq.ZMQError:
                pass
        self._sock.disable_monitor()
        self._mon.close(linger=0)
        self._sock.close(linger=linger)

    # -- internals --------------------------------------------------------------------------------

    def _what(self, op: str, seq: int) -> str:
        return f"{op}{self._spec.suffix} #{seq}"

    def _prepare(self, op: str, stuff: Any) -> tuple[int, bytes]:
        if self._closed:
            raise RuntimeError("this DistributedContext is closed")
        self._owner = threading.get_ident()  # the thread now using the socket (see send_signal)
        seq = self._seq + 1
        if self._error is not None:
            raise CollectiveError(f"{self._what(op, seq)} cannot run on rank {self._spec.rank}: an earlier "
                                  f"collective failed: {self._error}")
        data = encode(seq, op, stuff)  # a pickling error leaves the sequence untouched
        self._seq = seq
        return seq, data

    def _send(self, data: bytes) -> None:
        try:
            self._sock.send(data, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self._raise(f"rank {self._spec.rank} could not send to {self._spec.chief_label}: {exc}")

    def _wait_result(self, op: str, seq: int) -> Any:
        what = self._what(op, seq)
        deadline = now() + self._spec.timeout + _MARGIN_S
        while True:
            if self._results:
                k, kind, payload = self._results.popleft()
                if k == seq and kind == op:
                    return payload
                self._diverged(what, k, kind)
            self._check(what, deadline)
            self._pump(wait_ms(deadline, None if self._lost_at is None else self._lost_at + GRACE_S))

    def _diverged(self, what: str, k: int, kind: str) -> None:
        reason = f"{self._spec.chief_label} called {kind}{self._spec.suffix} #{k} where rank {self._spec.rank} " \
                 f"called {what}. {_ORDER_HINT}"
        try:
            self._sock.send(encode(k, FAIL, reason), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self._raise(f"{what} failed: {reason}")

    def _check(self, what: str, deadline: float) -> None:
        """Raise if the chief aborted, closed, vanished, or took longer than ``deadline``."""
        me, chief = self._spec.rank, self._spec.chief_label
        if self._problem is not None:
            self._raise(f"{what} failed on rank {me}: {self._problem}")
        if self._abort is not None:
            self._raise(f"{what} failed on rank {me}: {chief} aborted {self._abort['what']}: "
                        f"{self._abort['reason']}")
        if self._chief_closed:
            self._raise(f"{what} failed on rank {me}: {chief} closed its DistributedContext (or exited) "
                        f"without calling it. {_ORDER_HINT}")
        if self._lost_at is not None and now() - self._lost_at >= GRACE_S:
            self._raise(f"{what} failed on rank {me}: the connection to {chief} dropped (its process died "
                        "or was killed); look at its output for the cause.")
        if now() >= deadline:
            self._raise(f"{what} failed on rank {me}: {chief} did not answer within "
                        f"{self._spec.timeout:g} s (hung, or waiting for another rank). {_TIMEOUT_HINT}")

    def _raise(self, text: str) -> None:
        self._error = text
        raise CollectiveError(text)

    def _pump(self, timeout_ms: int) -> None:
        """File the messages and connection events that arrived, waiting up to ``timeout_ms`` for one."""
        if not self._drain() and timeout_ms > 0 and self._poller.poll(timeout_ms):
            self._drain()
        if readable(self._mon):
            for _event, _fd in read_events(self._mon):
                if self._welcomed and self._lost_at is None:
                    self._lost_at = now()

    def _drain(self) -> bool:
        """File every message waiting on the socket; True if there was any."""
        sock, got = self._sock, False
        while readable(sock):
            self._dispatch(sock.recv(zmq.NOBLOCK))
            got = True
        return got

    def _dispatch(self, data: bytes) -> None:
        try:
            seq, kind, payload = decode(data)
        except Exception as exc:  # noqa: BLE001 - reported as this collective's failure
            self._problem = f"a message from {self._spec.chief_label} could not be unpickled: {exc!r}"
            return
        if kind in OPS:
            self._results.append((seq, kind, payload))
        elif kind == ABORT:
            self._abort = payload
        elif kind == BYE:
            self._chief_closed = True
        elif kind in (WELCOME, REJECT):
            self._welcomed = self._welcomed or kind == WELCOME
            self._control.append((kind, payload))

