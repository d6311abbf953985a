"""The chief end of a collective star: a ROUTER that admits the workers, buffers what each sends,
answers collectives, and names the ranks that died, closed, diverged or hung (then aborts the rest)."""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Callable
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
    name_ranks,
    now,
    open_monitor,
    read_events,
    readable,
    tune,
    wait_ms,
)
from determined_trials.errors import CollectiveError

__all__ = ["ChiefEnd", "Hellos"]

_ORDER_HINT = "All ranks must call the same collectives in the same order."
_TIMEOUT_HINT = "Raise the limit with DistributedContext(timeout=...) or DET_COLLECTIVE_TIMEOUT."
_JOB_HINT = (
    "Check that every rank was started for the same job (DET_JOB_ID, or MASTER_ADDR/MASTER_PORT), with "
    "the same size, chief_ip and port."
)

Hellos = dict[int, dict[str, Any]]


class ChiefEnd:
    """The chief of one star (rank 0 of the job, or local rank 0 of a machine)."""

    def __init__(self, zctx: zmq.Context[Any], spec: StarSpec) -> None:
        self._spec = spec
        self._sock = zctx.socket(zmq.ROUTER)
        tune(self._sock)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if spec.endpoint.startswith("tcp://["):
            self._sock.setsockopt(zmq.IPV6, 1)
        self._mon = open_monitor(self._sock, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._mon, zmq.POLLIN)
        self._seq = 0
        self._hellos: Hellos = {}
        self._ids: dict[int, bytes] = {}  # member index -> routing id
        self._by_id: dict[bytes, int] = {}
        self._fds: dict[int, int] = {}  # connection fd -> member index
        self._dead_fds: set[int] = set()  # fds that dropped before we knew whose they were
        self._labels: dict[int, str] = {}
        self._queues: dict[int, collections.deque[tuple[int, str, Any]]] = {}
        self._lost: dict[int, float] = {}  # member index -> when its connection dropped
        self._closed_ranks: set[int] = set()  # members that said BYE
        self._problems: dict[int, str] = {}  # member index -> what went wrong with it
        self._signalled = False
        self._started = False
        self._error: str | None = None
        self._closed = False
        try:
            self._sock.bind(spec.endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise CollectiveError(
                f"rank {spec.rank} could not listen on {spec.endpoint}: {exc}. If another job uses that port, "
                "give this one a free port (DET_CORE_PORT, pub_port= or port_offset=)."
            ) from exc
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    # -- start-up ---------------------------------------------------------------------------------

    def handshake(self, check: Callable[[Hellos], str | None], welcome: Callable[[int, Hellos], Any]) -> Hellos:
        """Wait until every worker said hello, let ``check`` veto the group, then welcome each worker."""
        spec = self._spec
        deadline = now() + spec.timeout
        while len(self._hellos) < spec.size - 1:
            self._raise_startup_problems(deadline)
            self._pump(wait_ms(deadline, *(t + GRACE_S for t in self._lost.values())))
        problem = check(self._hellos)
        if problem is not None:
            self._fail("start-up", problem)
        for index in range(1, spec.size):
            self._send(index, encode(0, WELCOME, welcome(index, self._hellos)))
        self._started = True  # later hellos come from the next context at this address: not ours
        return self._hellos

    def _raise_startup_problems(self, deadline: float) -> None:
        if self._problems:
            self._fail("start-up", " ".join(self._problems.values()))
        dead = [i for i, t in self._lost.items() if now() - t >= GRACE_S]
        if dead:
            self._fail("start-up", f"{self._name(dead)} connected and then disconnected (its process died?).")
        if now() >= deadline:
            missing = [f"{self._spec.member_word} {i}" for i in range(1, self._spec.size) if i not in self._hellos]
            self._fail("start-up", f"{name_ranks(missing) or 'some ranks'} never connected to the chief at "
                                   f"{self.endpoint} within {self._spec.timeout:g} s. {_JOB_HINT}")

    # -- collectives ------------------------------------------------------------------------------

    def gather(self, stuff: Any) -> list[Any] | None:
        """Everyone's part, in member order (the chief's own object is not copied)."""
        seq = self._next()
        parts = self._collect("gather", seq)
        return [stuff, *parts]

    def allgather(self, stuff: Any) -> list[Any]:
        """Everyone's part, also sent back to every worker."""
        seq = self._next()
        result = [stuff, *self._collect("allgather", seq)]
        self._send_all(self._encode_result(seq, "allgather", result))
        return result

    def broadcast(self, stuff: Any = None) -> Any:
        """Send ``stuff`` to every worker; does not wait for them, except to check one that vanished."""
        seq = self._next()
        what = self._what("broadcast", seq)
        data = self._encode_result(seq, "broadcast", stuff)
        self._pump(0)
        deadline = now() + self._spec.timeout
        while True:
            doubtful = [i for i in self._ids if not self._take(i, "broadcast", seq)[0] and self._is_doubtful(i)]
            if not doubtful:
                break
            wake = self._check_missing(what, doubtful, deadline)
            self._pump(wait_ms(wake))
        self._send_all(data)
        return stuff

    def poll_signals(self) -> bool:
        """True once any worker has sent a preemption signal (non-blocking; stays True)."""
        if not self._closed:
            self._pump(0)
        return self._signalled

    def note_signal(self) -> None:
        """The chief's own process received a preemption signal."""
        self._signalled = True

    def close(self) -> None:
        """Tell the workers the chief is done, then close the sockets; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._ids:
            self._pump(0)
            self._send_all(encode(self._seq, BYE, None), quiet=True)
        self._sock.disable_monitor()
        self._mon.close(linger=0)
        self._sock.close()
        path = getattr(self, "endpoint", "").removeprefix("ipc://")
        if path.startswith("/"):  # libzmq leaves the socket file behind
            with contextlib.suppress(OSError):
                os.unlink(path)

    # -- internals --------------------------------------------------------------------------------

    def _what(self, op: str, seq: int) -> str:
        return f"{op}{self._spec.suffix} #{seq}"

    def _name(self, indexes: list[int]) -> str:
        return name_ranks([self._labels.get(i, f"member {i}") for i in sorted(indexes)])

    def _next(self) -> int:
        if self._closed:
            raise RuntimeError("this DistributedContext is closed")
        if self._error is not None:
            raise CollectiveError(f"rank {self._spec.rank} cannot run another collective: an earlier one "
                                  f"failed: {self._error}")
        self._seq += 1
        return self._seq

    def _encode_result(self, seq: int, op: str, result: Any) -> bytes:
        try:
            return encode(seq, op, result)
        except Exception as exc:  # the workers must not wait forever for it
            self._fail(self._what(op, seq), f"rank {self._spec.rank}'s object cannot be pickled: {exc!r}")
            raise AssertionError("unreachable") from exc

    def _collect(self, op: str, seq: int) -> list[Any]:
        """Wait for every worker's part of collective ``seq``."""
        what = self._what(op, seq)
        deadline = now() + self._spec.timeout
        parts: dict[int, Any] = {}
        missing = set(self._ids)
        while True:
            for index in list(missing):
                found, payload = self._take(index, op, seq)
                if found:
                    parts[index] = payload
                    missing.discard(index)
            if not missing:
                return [parts[i] for i in sorted(parts)]
            wake = self._check_missing(what, sorted(missing), deadline)
            self._pump(wait_ms(wake))

    def _take(self, index: int, op: str, seq: int) -> tuple[bool, Any]:
        """Pop member ``index``'s message for collective ``seq`` if it is there; raise if it diverged."""
        queue = self._queues[index]
        while queue:
            k, kind, payload = queue[0]
            if k < seq and kind == "broadcast":  # a broadcast this member already got
                queue.popleft()
                continue
            if k == seq and kind == op:
                queue.popleft()
                return True, payload
            label, suffix = self._labels[index], self._spec.suffix
            if k < seq:
                reason = f"{label} called {kind}{suffix} #{k} where rank {self._spec.rank} called broadcast{suffix}."
            elif k == seq:
                reason = f"{label} called {kind}{suffix} #{k} where rank {self._spec.rank} called {op}{suffix}."
            else:
                reason = f"{label} sent {kind}{suffix} #{k} before #{seq} (out of order)."
            self._fail(self._what(op, seq), f"{reason} {_ORDER_HINT}")
        return False, None

    def _is_doubtful(self, index: int) -> bool:
        return index in self._lost or index in self._closed_ranks or index in self._problems

    def _check_missing(self, what: str, missing: list[int], deadline: float) -> float:
        """Raise naming the missing members that failed; else return when to look again."""
        t = now()
        for index in missing:
            if index in self._problems:
                self._fail(what, f"{self._labels[index]} failed: {self._problems[index]}")
            if index in self._closed_ranks:
                self._fail(what, f"{self._labels[index]} closed its DistributedContext (or exited) without "
                                 f"calling it. {_ORDER_HINT}")
        dead = [i for i in missing if i in self._lost and t - self._lost[i] >= GRACE_S]
        if dead:
            self._fail(what, f"{self._name(dead)} disconnected without answering (its process died or was "
                             "killed); look at its output for the cause.")
        if t >= deadline:
            self._fail(what, f"{self._name(missing)} did not answer within {self._spec.timeout:g} s (hung, "
                             f"or busy elsewhere). {_TIMEOUT_HINT}")
        return min([deadline, *(self._lost[i] + GRACE_S for i in missing if i in self._lost)])

    def _fail(self, what: str, reason: str) -> None:
        """Remember the failure, tell every worker still there, and raise."""
        self._error = f"{what} failed: {reason}"
        self._send_all(encode(self._seq, ABORT, {"what": what, "reason": reason}), quiet=True)
        raise CollectiveError(self._error)

    def _send(self, index: int, data: bytes) -> None:
        try:
            self._sock.send_multipart([self._ids[index], data], zmq.NOBLOCK)
        except zmq.ZMQError:  # EHOSTUNREACH: its connection is gone; the next collective names it
            self._lost.setdefault(index, now())

    def _send_all(self, data: bytes, quiet: bool = False) -> None:
        for index in self._ids:
            if quiet and (index in self._lost or index in self._closed_ranks):
                continue
            self._send(index, data)

    def _pump(self, timeout_ms: int) -> None:
        """File the messages and connection events that arrived, waiting up to ``timeout_ms`` for one."""
        if not self._drain() and timeout_ms > 0 and self._poller.poll(timeout_ms):
            self._drain()
        if readable(self._mon):
            for event, fd in read_events(self._mon):
                if event == zmq.EVENT_ACCEPTED:
                    self._dead_fds.discard(fd)
                elif fd in self._fds:
                    self._lost.setdefault(self._fds.pop(fd), now())
                else:
                    self._dead_fds.add(fd)

    def _drain(self) -> bool:
        """File every message waiting on the socket; True if there was any."""
        sock, got = self._sock, False
        while readable(sock):
            ident = sock.recv(zmq.NOBLOCK)
            if not sock.get(zmq.RCVMORE):
                continue  # not a routed message with a body: not one of ours
            index = self._by_id.get(ident)
            if index is None:  # a newcomer: keep the frame to learn which connection it came on
                frame = sock.recv(zmq.NOBLOCK, copy=False)
                self._dispatch(ident, None, frame.bytes, int(frame.get(zmq.SRCFD)))
            else:
                self._dispatch(ident, index, sock.recv(zmq.NOBLOCK), -1)
            while sock.get(zmq.RCVMORE):  # extra frames are not ours either
                sock.recv(zmq.NOBLOCK)
            got = True
        return got

    def _dispatch(self, ident: bytes, index: int | None, data: bytes, fd: int) -> None:
        try:
            seq, kind, payload = decode(data)
        except Exception as exc:  # noqa: BLE001 - attributed to the member that sent it
            if index is not None:
                self._problems[index] = f"its message could not be unpickled on rank {self._spec.rank}: {exc!r}"
            return
        if kind == SIGNAL:
            self._signalled = True
        elif index is None:
            if kind == HELLO and isinstance(payload, dict) and not self._started:
                self._admit(ident, fd, payload)
        elif kind in OPS:
            self._queues[index].append((seq, kind, payload))
        elif kind == BYE:
            self._closed_ranks.add(index)
        elif kind == FAIL:
            self._problems[index] = str(payload)

    def _admit(self, ident: bytes, fd: int, hello: dict[str, Any]) -> None:
        """File a worker's hello, or refuse it when it belongs to another job or duplicates a member."""
        spec = self._spec
        token, index, rank = hello.get("token"), hello.get("index"), hello.get("rank")
        if token is not None and spec.token is not None and token != spec.token:
            self._reject(ident, f"the process listening at {self.endpoint} belongs to another job. {_JOB_HINT}")
            return
        if not isinstance(index, int) or not 0 < index < spec.size or hello.get("size") != spec.size:
            self._problems[-1] = (f"a process (pid {hello.get('pid')}) joined as rank {rank} of a job of size "
                                  f"{hello.get('size')}, but rank {spec.rank} has size {spec.size}. {_JOB_HINT}")
            self._reject(ident, self._problems[-1])
            return
        if index in self._ids:
            self._problems[-1] = (f"two processes (pids {self._hellos[index].get('pid')} and {hello.get('pid')}) "
                                  f"both joined as rank {rank}: give every process its own rank.")
            self._reject(ident, self._problems[-1])
            return
        self._ids[index], self._by_id[ident] = ident, index
        self._hellos[index] = hello
        self._labels[index] = f"rank {rank}"
        self._queues[index] = collections.deque()
        self._fds[fd] = index
        if fd in self._dead_fds:
            self._lost.setdefault(index, now())

    def _reject(self, ident: bytes, reason: str) -> None:
        try:
            self._sock.send_multipart([ident, encode(0, REJECT, reason)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

