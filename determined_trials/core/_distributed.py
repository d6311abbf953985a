"""DistributedContext: the rank layout of a job and object collectives (gather, allgather, broadcast and
their per-machine ``_local`` variants) between its processes, over pyzmq; no torch needed."""

from __future__ import annotations

import os
import weakref
from types import TracebackType
from typing import Any

from determined_trials.core.transport import End, Layout, Transport

__all__ = ["DistributedContext", "dummy_distributed"]

_DEFAULT_TIMEOUT_S = 1800.0


class DistributedContext:
    """Where this process sits in a job (rank, local rank, agent) and collectives with the other ranks.

    All ranks must call the same collectives in the same order. A dead, closed or hung peer makes the
    collective raise ``det.errors.CollectiveError`` naming the rank, after at most ``timeout`` seconds
    (default: env ``DET_COLLECTIVE_TIMEOUT``, else 1800). A context of size 1 opens no sockets.
    ``pull_port`` is accepted for compatibility and unused (one socket per star carries both ways).
    """

    def __init__(
        self, *, rank: int, size: int, local_rank: int, local_size: int, cross_rank: int, cross_size: int,
        chief_ip: str | None = None, pub_port: int | None = None, pull_port: int | None = None,
        port_offset: int = 0, force_tcp: bool = False, timeout: float | None = None,
    ) -> None:
        layout = Layout(rank, size, local_rank, local_size, cross_rank, cross_size)
        _validate_layout(layout)
        for name, value in (("pub_port", pub_port), ("pull_port", pull_port), ("port_offset", port_offset)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"DistributedContext({name}=...) must be an int, got {value!r}")
        self._layout = layout
        self._timeout = _resolve_timeout(timeout)
        self._signalled = False
        self._transport: Transport | None = None
        if size > 1:
            ip = _resolve_chief_ip(chief_ip, cross_size)
            self._transport = Transport(layout, chief_ip=ip, pub_port=pub_port, port_offset=port_offset,
                                        force_tcp=force_tcp, timeout=self._timeout)
            self._finalizer = weakref.finalize(self, self._transport.close)

    # -- layout -----------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """Index of this process in the job (0 is the chief)."""
        return self._layout.rank

    @property
    def size(self) -> int:
        """Number of processes in the job."""
        return self._layout.size

    @property
    def local_rank(self) -> int:
        """Index of this process on its machine (0 is the local chief)."""
        return self._layout.local_rank

    @property
    def local_size(self) -> int:
        """Number of processes of the job on this machine."""
        return self._layout.local_size

    @property
    def cross_rank(self) -> int:
        """Index of this machine (agent) in the job."""
        return self._layout.cross_rank

    @property
    def cross_size(self) -> int:
        """Number of machines (agents) in the job."""
        return self._layout.cross_size

    def get_rank(self) -> int:
        """Index of this process in the job."""
        return self.rank

    def get_local_rank(self) -> int:
        """Index of this process on its machine."""
        return self.local_rank

    def get_size(self) -> int:
        """Number of processes in the job."""
        return self.size

    def get_num_agents(self) -> int:
        """Number of machines (agents) in the job (``cross_size``)."""
        return self.cross_size

    def get_cross_rank(self) -> int:
        """Index of this machine in the job."""
        return self.cross_rank

    def get_local_size(self) -> int:
        """Number of processes of the job on this machine."""
        return self.local_size

    # -- collectives ------------------------------------------------------------------------------

    def gather(self, stuff: Any) -> list[Any] | None:
        """The chief gets everyone's ``stuff`` in rank order; workers get None (and do not wait)."""
        end = self._end(local=False)
        return [stuff] if end is None else end.gather(stuff)

    def gather_local(self, stuff: Any) -> list[Any] | None:
        """The local chief gets its machine's ``stuff`` in local-rank order; others get None."""
        end = self._end(local=True)
        return [stuff] if end is None else end.gather(stuff)

    def allgather(self, stuff: Any) -> list[Any]:
        """Every rank gets everyone's ``stuff`` in rank order."""
        end = self._end(local=False)
        return [stuff] if end is None else end.allgather(stuff)

    def allgather_local(self, stuff: Any) -> list[Any]:
        """Every rank gets its machine's ``stuff`` in local-rank order."""
        end = self._end(local=True)
        return [stuff] if end is None else end.allgather(stuff)

    def broadcast(self, stuff: Any = None) -> Any:
        """Every rank gets the chief's ``stuff`` (the workers' argument is ignored)."""
        end = self._end(local=False)
        return stuff if end is None else end.broadcast(stuff)

    def broadcast_local(self, stuff: Any = None) -> Any:
        """Every rank gets its local chief's ``stuff``."""
        end = self._end(local=True)
        return stuff if end is None else end.broadcast(stuff)

    def close(self) -> None:
        """Tell the peers this rank is done and close the sockets; idempotent."""
        if self._transport is not None:
            self._finalizer()

    def __enter__(self) -> DistributedContext:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        lay = self._layout
        return (f"DistributedContext(rank={lay.rank}, size={lay.size}, local_rank={lay.local_rank}, "
                f"local_size={lay.local_size}, cross_rank={lay.cross_rank}, cross_size={lay.cross_size})")

    # -- used by PreemptContext -------------------------------------------------------------------

    def _chief_poll_worker_signals(self) -> bool:
        """Chief: True once any rank has sent a preemption signal (non-blocking; stays True)."""
        if self.rank != 0:
            raise RuntimeError("_chief_poll_worker_signals() is for the chief (rank 0) only")
        if self._transport is None or self._finalizer.alive is False:
            return self._signalled
        return self._transport.poll_signals()

    def _worker_send_signal(self) -> None:
        """Tell the chief, without waiting, that this process received a preemption signal."""
        if self._transport is None or not self._finalizer.alive:
            self._signalled = True
            return
        self._transport.send_signal()

    # -- classmethods -----------------------------------------------------------------------------

    @classmethod
    def from_torch_distributed(cls, chief_ip: str | None = None) -> DistributedContext:
        """From torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
        GROUP_WORLD_SIZE (chief IP: ``chief_ip`` or DET_CHIEF_IP when GROUP_WORLD_SIZE > 1)."""
        env = _EnvReader("from_torch_distributed()", "run it under torchrun (or set these variables)")
        rank, size = env.get("RANK"), env.get("WORLD_SIZE")
        local_rank, local_size = env.get("LOCAL_RANK"), env.get("LOCAL_WORLD_SIZE")
        cross_rank = env.get("GROUP_RANK", default=rank // max(1, local_size))
        cross_size = env.get("GROUP_WORLD_SIZE", default=max(1, size // max(1, local_size)))
        return cls(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                   cross_rank=cross_rank, cross_size=cross_size, chief_ip=chief_ip)

    @classmethod
    def from_deepspeed(cls, chief_ip: str | None = None) -> DistributedContext:
        """From the deepspeed launcher's environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_SIZE, CROSS_RANK,
        CROSS_SIZE (chief IP: ``chief_ip`` or DET_CHIEF_IP when CROSS_SIZE > 1)."""
        env = _EnvReader("from_deepspeed()", "run it under the deepspeed launcher (or set these variables)")
        rank, size, local_rank = env.get("RANK"), env.get("WORLD_SIZE"), env.get("LOCAL_RANK")
        local_size = env.get("LOCAL_SIZE", "LOCAL_WORLD_SIZE")
        cross_rank = env.get("CROSS_RANK", "GROUP_RANK", default=rank // max(1, local_size))
        cross_size = env.get("CROSS_SIZE", "GROUP_WORLD_SIZE", default=max(1, size // max(1, local_size)))
        return cls(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                   cross_rank=cross_rank, cross_size=cross_size, chief_ip=chief_ip)

    @classmethod
    def from_horovod(cls, hvd: Any, chief_ip: str | None = None) -> DistributedContext:
        """From an initialised horovod module (``hvd.init()`` already called)."""
        return cls(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                   cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(), chief_ip=chief_ip)

    # -- internals --------------------------------------------------------------------------------

    def _end(self, local: bool) -> End | None:
        transport = self._transport
        if transport is None:
            return None
        if not self._finalizer.alive:
            raise RuntimeError("this DistributedContext is closed; create a new one to run more collectives")
        if transport.owner_pid != os.getpid():
            raise RuntimeError("a DistributedContext cannot be used in a forked child process; create one there")
        return transport.local_end if local else transport.global_end


def dummy_distributed() -> DistributedContext:
    """A context of size 1 (no sockets; every collective returns at once)."""
    return DistributedContext(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)


def _validate_layout(lay: Layout) -> None:
    """Raise TypeError/ValueError when the six numbers cannot describe a process of one job."""
    for name, value in vars(lay).items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"DistributedContext({name}=...) must be an int, got {value!r}")
    for index, count in (("rank", "size"), ("local_rank", "local_size"), ("cross_rank", "cross_size")):
        i, n = getattr(lay, index), getattr(lay, count)
        if n < 1:
            raise ValueError(f"DistributedContext({count}={n}): must be at least 1")
        if not 0 <= i < n:
            raise ValueError(f"DistributedContext({index}={i}, {count}={n}): {index} must be in 0..{n - 1}")
    if lay.local_size + lay.cross_size - 1 > lay.size:
        raise ValueError(
            f"DistributedContext(size={lay.size}, local_size={lay.local_size}, cross_size={lay.cross_size}): "
            f"{lay.local_size} ranks on this agent plus at least one on each of the other {lay.cross_size - 1} "
            f"agents is more than size={lay.size}"
        )
    if lay.cross_size == 1 and (lay.local_size != lay.size or lay.local_rank != lay.rank):
        raise ValueError(
            f"DistributedContext(cross_size=1) means one agent holds every rank, so local_size must equal "
            f"size and local_rank must equal rank (got size={lay.size}, local_size={lay.local_size}, "
            f"rank={lay.rank}, local_rank={lay.local_rank})"
        )


def _resolve_timeout(timeout: float | None) -> float:
    source = "timeout"
    if timeout is None:
        raw = os.environ.get("DET_COLLECTIVE_TIMEOUT")
        if not raw:
            return _DEFAULT_TIMEOUT_S
        source = "DET_COLLECTIVE_TIMEOUT"
        try:
            timeout = float(raw)
        except ValueError:
            raise ValueError(f"DET_COLLECTIVE_TIMEOUT={raw!r} is not a number of seconds") from None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{source}={timeout!r}: the collective timeout must be a positive number of seconds")
    return float(timeout)


def _resolve_chief_ip(chief_ip: str | None, cross_size: int) -> str:
    ip = chief_ip or os.environ.get("DET_CHIEF_IP")
    if ip:
        return ip
    if cross_size == 1:
        return "127.0.0.1"
    raise ValueError(
        f"DistributedContext needs the chief's IP address when the job spans {cross_size} agents "
        "(cross_size > 1): pass chief_ip=... or set DET_CHIEF_IP to an address of the rank-0 machine that "
        "every agent can reach (under torchrun, often the same as MASTER_ADDR)."
    )


class _EnvReader:
    """Reads integer environment variables for a factory, with errors naming the variable."""

    def __init__(self, factory: str, hint: str) -> None:
        self._factory, self._hint = factory, hint

    def get(self, *names: str, default: int | None = None) -> int:
        """The first of ``names`` that is set, else ``default``; raises when neither exists."""
        for name in names:
            raw = os.environ.get(name)
            if raw:
                try:
                    return int(raw)
                except ValueError:
                    raise ValueError(f"DistributedContext.{self._factory}: {name}={raw!r} is not an integer") from None
        if default is not None:
            return default
        raise ValueError(f"DistributedContext.{self._factory}: environment variable {' or '.join(names)} is not "
                         f"set; {self._hint}")
