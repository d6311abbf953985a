"""Shared pieces of the collective transport: the rank layout, the wire format, socket options and
the timing constants used by both ends of a star (chief: ``_transport_chief``, worker: ``_transport_worker``)."""

from __future__ import annotations

import dataclasses
import pickle
import struct
import time
from typing import Any, cast

import zmq

__all__ = [
    "ABORT", "BYE", "FAIL", "GRACE_S", "HELLO", "OPS", "REJECT", "SIGNAL", "WELCOME",
    "Layout", "StarSpec", "decode", "encode", "name_ranks", "now", "open_monitor", "read_events", "readable",
    "tune", "wait_ms",
]

# Message kinds. Collective messages use the collective's name ("gather", "allgather", "broadcast").
OPS = ("gather", "allgather", "broadcast")
HELLO, WELCOME, REJECT = "hello", "welcome", "reject"  # start-up handshake
SIGNAL = "signal"  # worker -> chief, out of band: "I received a preemption signal"
BYE = "bye"  # either way: "I closed my DistributedContext"
ABORT = "abort"  # chief -> workers: a collective failed, here is why
FAIL = "fail"  # worker -> chief: this worker saw the ranks diverge

GRACE_S = 1.0  # after a peer's connection drops, messages it already sent may still arrive for this long
_HEARTBEAT_IVL_MS = 2_000  # ZMTP heartbeats find peers whose host vanished without closing the connection
_HEARTBEAT_TIMEOUT_MS = 20_000
LINGER_MS = 1_000

now = time.monotonic


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one process sits in a job: global rank, rank on its machine, machine index."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def as_dict(self) -> dict[str, int]:
        """The six numbers by name (sent in the start-up handshake)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class StarSpec:
    """One star (a chief and its workers) seen from one member."""

    suffix: str  # "" for the global star, "_local" for a machine's local star (used in messages)
    index: int  # this member's index in the star: its rank, or its local rank
    size: int  # members in the star
    rank: int  # this member's global rank (used in messages)
    endpoint: str  # where the chief binds and the workers connect
    timeout: float  # seconds any one wait may take before the missing ranks are named
    token: str | None  # job identity checked at start-up when known on every machine
    chief_label: str  # how messages name the chief, e.g. "rank 0"
    member_word: str = "rank"  # how messages name a member index: "rank" or "local rank"


def encode(seq: int, kind: str, payload: Any) -> bytes:
    """One message on the wire: a pickled ``(seq, kind, payload)``."""
    return pickle.dumps((seq, kind, payload), protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes | memoryview) -> tuple[int, str, Any]:
    """Inverse of :func:`encode`; raises ValueError on anything else."""
    message = pickle.loads(data)
    if not (isinstance(message, tuple) and len(message) == 3 and isinstance(message[1], str)):
        raise ValueError(f"not a collective message: {type(message).__name__}")
    seq, kind, payload = message
    return int(seq), kind, payload


def tune(sock: zmq.Socket[Any]) -> None:
    """Options shared by every collective socket: unbounded queues, heartbeats, bounded linger."""
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _HEARTBEAT_TIMEOUT_MS)


def open_monitor(sock: zmq.Socket[Any], events: int) -> zmq.Socket[Any]:
    """A PAIR socket receiving ``sock``'s connection events."""
    return sock.get_monitor_socket(events)


_EVENT = struct.Struct("=HI")


def read_events(mon: zmq.Socket[Any]) -> list[tuple[int, int]]:
    """Every pending ``(event, value)`` on a monitor socket (value is the connection's fd)."""
    events: list[tuple[int, int]] = []
    while True:
        try:
            frames = mon.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return events
        if frames and len(frames[0]) >= _EVENT.size:
            events.append(_EVENT.unpack_from(frames[0]))


def readable(sock: zmq.Socket[Any]) -> bool:
    """A message is waiting on ``sock`` (cheaper than a poll when nothing has to wait)."""
    return bool(cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN)


def wait_ms(*deadlines: float | None) -> int:
    """Milliseconds until the earliest deadline (at least 0, at most 10 s so the loop re-checks)."""
    soonest = min((d for d in deadlines if d is not None), default=now() + 10.0)
    return max(0, min(10_000, int((soonest - now()) * 1000) + 1))


def name_ranks(labels: list[str]) -> str:
    """``["rank 2"]`` -> ``rank 2``; ``["rank 2", "rank 3"]`` -> ``rank 2 and rank 3``."""
    if len(labels) <= 1:
        return "".join(labels)
    return ", ".join(labels[:-1]) + " and " + labels[-1]
