"""One process's collective transport (pyzmq): the job-wide star (chief = rank 0) and, on multi-machine
jobs, its machine's local star (chief = local rank 0, address handed out at start-up); opened and
handshaken in the constructor."""

from __future__ import annotations

import os
from typing import Any

import zmq

from determined_trials.core.transport._addresses import (
    ensure_unused,
    ipc_endpoint,
    ipc_supported,
    job_key,
    tcp_bind_endpoint,
    tcp_connect_endpoint,
    tcp_port,
)
from determined_trials.core.transport._chief import ChiefEnd, Hellos
from determined_trials.core.transport._common import Layout, StarSpec
from determined_trials.core.transport._worker import WorkerEnd

__all__ = ["End", "Layout", "Transport", "check_layouts"]

End = ChiefEnd | WorkerEnd

_LAYOUT_HINT = (
    "Give each process its own rank, local_rank and cross_rank (or use DistributedContext.from_torch_distributed() "
    "/ from_deepspeed() under their launchers)."
)


class Transport:
    """The sockets behind a DistributedContext of size > 1."""

    def __init__(self, layout: Layout, *, chief_ip: str, pub_port: int | None, port_offset: int,
                 force_tcp: bool, timeout: float) -> None:
        self.owner_pid = os.getpid()
        self._layout = layout
        self._zctx: zmq.Context[Any] = zmq.Context(io_threads=1)
        self.global_end: End | None = None
        self.local_end: End | None = None  # None: this machine runs one rank, local collectives are trivial
        self._local_chief: ChiefEnd | None = None
        self._local_addrs: dict[int, tuple[str | None, int]] = {}  # chief: agent -> its local chief
        try:
            self._open(chief_ip, pub_port, port_offset, force_tcp, timeout)
        except BaseException:
            self.close()
            raise

    def _open(self, chief_ip: str, pub_port: int | None, port_offset: int, force_tcp: bool,
              timeout: float) -> None:
        lay = self._layout
        job = job_key(lay.size)
        use_ipc = lay.cross_size == 1 and not force_tcp and ipc_supported()
        if use_ipc:
            bind = connect = ipc_endpoint(job.digest)
        else:
            port = tcp_port(pub_port, port_offset)
            bind, connect = tcp_bind_endpoint(chief_ip, port), tcp_connect_endpoint(chief_ip, port)
        if lay.cross_size > 1 and lay.local_size > 1 and lay.local_rank == 0:
            local_bind = ipc_endpoint(f"{job.digest[:12]}-a{lay.cross_rank}-{os.getpid()}") \
                if ipc_supported() and not force_tcp else "tcp://127.0.0.1:*"
            self._local_chief = ChiefEnd(self._zctx, self._local_spec(local_bind, timeout, lay.rank))
        token = job.digest if job.shared else None
        spec = StarSpec("", lay.rank, lay.size, lay.rank, bind if lay.rank == 0 else connect, timeout, token, "rank 0")
        if lay.rank == 0:
            if use_ipc:
                ensure_unused(bind, job)
            chief = self.global_end = ChiefEnd(self._zctx, spec)
            chief.handshake(self._check_group, self._welcome)
            welcome: dict[str, Any] = self._welcome(0, {})
        else:
            worker = self.global_end = WorkerEnd(self._zctx, spec)
            local_addr = self._local_chief.endpoint if self._local_chief else None
            welcome = worker.handshake({"rank": lay.rank, "layout": lay.as_dict(), "local": local_addr})
        self._open_local(welcome, timeout)

    def _local_spec(self, endpoint: str, timeout: float, chief_rank: int) -> StarSpec:
        lay = self._layout
        label = f"rank {chief_rank} (the local chief of agent {lay.cross_rank})"
        return StarSpec("_local", lay.local_rank, lay.local_size, lay.rank, endpoint, timeout, None, label,
                        member_word="local rank")

    def _open_local(self, welcome: dict[str, Any], timeout: float) -> None:
        lay = self._layout
        if lay.cross_size == 1:
            self.local_end = self.global_end
        elif self._local_chief is not None:
            self._local_chief.handshake(lambda hellos: None, lambda index, hellos: {})
            self.local_end = self._local_chief
        elif lay.local_size > 1:
            spec = self._local_spec(welcome["local"], timeout, welcome["local_chief"])
            worker = self.local_end = WorkerEnd(self._zctx, spec)
            worker.handshake({"rank": lay.rank})

    def _check_group(self, hellos: Hellos) -> str | None:
        layouts = {0: self._layout}
        try:
            for hello in hellos.values():
                layouts[hello["rank"]] = Layout(**hello["layout"])
        except (KeyError, TypeError) as exc:
            return f"a rank sent a start-up message this version does not understand ({exc!r}). {_LAYOUT_HINT}"
        problem = check_layouts(layouts)
        if problem is None:
            self._local_addrs = self._collect_local_addrs(hellos)
        return problem

    def _collect_local_addrs(self, hellos: Hellos) -> dict[int, tuple[str | None, int]]:
        addrs: dict[int, tuple[str | None, int]] = {}
        own = self._local_chief.endpoint if self._local_chief else None
        for rank, lay, addr in [(0, self._layout, own)] + [
            (h["rank"], Layout(**h["layout"]), h["local"]) for h in hellos.values()
        ]:
            if lay.local_rank == 0:
                addrs[lay.cross_rank] = (addr, rank)
        return addrs

    def _welcome(self, index: int, hellos: Hellos) -> dict[str, Any]:
        if self._layout.cross_size == 1:
            return {}
        cross_rank = self._layout.cross_rank if index == 0 else hellos[index]["layout"]["cross_rank"]
        addr, chief_rank = self._local_addrs[cross_rank]
        return {"local": addr, "local_chief": chief_rank}

    def send_signal(self) -> None:
        """Tell the chief this process received a preemption signal (the chief notes its own)."""
        end = self.global_end
        if isinstance(end, WorkerEnd):
            end.send_signal()
        elif isinstance(end, ChiefEnd):
            end.note_signal()

    def poll_signals(self) -> bool:
        """Chief only: True once any rank has sent a preemption signal."""
        if not isinstance(self.global_end, ChiefEnd):
            raise RuntimeError("only the chief (rank 0) can poll the workers' preemption signals")  # noqa: TRY004
        return self.global_end.poll_signals()

    def close(self) -> None:
        """Close both stars and the zmq context; idempotent, and a no-op in a forked child."""
        if os.getpid() != self.owner_pid or self._zctx.closed:
            return
        for end in (self.local_end, self._local_chief, self.global_end):
            if end is not None:
                end.close()
        self._zctx.term()


def check_layouts(layouts: dict[int, Layout]) -> str | None:
    """Why the ranks' layouts (by rank) do not describe one job, or None when they do."""
    chief = layouts[0]
    nodes: dict[int, list[Layout]] = {}
    for lay in layouts.values():
        if lay.cross_size != chief.cross_size:
            return f"rank {lay.rank} has cross_size={lay.cross_size} but rank 0 has {chief.cross_size}. {_LAYOUT_HINT}"
        nodes.setdefault(lay.cross_rank, []).append(lay)
    if sorted(nodes) != list(range(chief.cross_size)):
        return (f"the ranks are on agents (cross_rank) {sorted(nodes)} but cross_size={chief.cross_size} "
                f"needs every agent 0..{chief.cross_size - 1}. {_LAYOUT_HINT}")
    for cross_rank, members in sorted(nodes.items()):
        local_ranks = sorted(m.local_rank for m in members)
        if local_ranks != list(range(len(members))) or {m.local_size for m in members} != {len(members)}:
            found = ", ".join(f"rank {m.rank} local_rank={m.local_rank} local_size={m.local_size}"
                              for m in sorted(members, key=lambda m: m.rank))
            return f"agent {cross_rank} has {len(members)} ranks that do not fit together ({found}). {_LAYOUT_HINT}"
    return None
