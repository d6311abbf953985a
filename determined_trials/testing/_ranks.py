"""run_ranks: run a function as the ranks of a job, one real process each (multiprocessing spawn), with
a DistributedContext per rank; results in rank order, the failing rank's traceback, no process left."""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

__all__ = ["RanksFailed", "free_port", "run_ranks"]

_KILL_WAIT_S = 5.0
_AFTER_FAILURE_S = 5.0  # after a rank fails, how long the others get to report their own outcome


class RanksFailed(RuntimeError):
    """One or more ranks raised, died or timed out.

    ``failures`` maps rank -> traceback text (or what happened to it); ``results`` holds the ranks that
    returned, by rank.
    """

    def __init__(self, message: str, failures: dict[int, str], results: dict[int, Any]) -> None:
        super().__init__(message)
        self.failures = failures
        self.results = results


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(
    fn: Callable[..., Any], size: int, *, local_size: int | None = None, args: Sequence[Any] = (),
    timeout: float = 60.0, env: Mapping[str, str] | None = None, force_tcp: bool = False,
) -> list[Any]:
    """Run ``fn(distributed_context, *args)`` in ``size`` processes and return their results by rank.

    ``local_size`` ranks share each pretend agent (default: all on one); with several agents the job
    talks TCP on 127.0.0.1 on a free port. ``fn``, ``args`` and results must be picklable (``fn``
    defined at module level). Each context gets a fresh job id and a collective timeout of ``timeout``
    unless ``env`` sets DET_COLLECTIVE_TIMEOUT. Raises :class:`RanksFailed` with the failing rank's
    traceback if a rank raises or dies, or when ``timeout`` seconds pass; every process is gone by then.
    """
    local_size = size if local_size is None else local_size
    if size < 1 or local_size < 1 or size % local_size:
        raise ValueError(f"run_ranks(size={size}, local_size={local_size}): size must be a positive multiple "
                         "of local_size")
    child_env = {"DET_JOB_ID": f"run-ranks-{uuid.uuid4().hex[:12]}", "DET_COLLECTIVE_TIMEOUT": str(timeout),
                 **(env or {})}
    port = free_port() if size // local_size > 1 or force_tcp else None
    ctx = multiprocessing.get_context("spawn")
    procs: list[BaseProcess] = []
    conns: dict[int, multiprocessing.connection.Connection] = {}
    try:
        for rank in range(size):
            reader, writer = ctx.Pipe(duplex=False)
            layout = (rank, size, rank % local_size, local_size, rank // local_size, size // local_size)
            proc = ctx.Process(target=_child_main, name=f"rank-{rank}",
                               args=(fn, tuple(args), layout, port, force_tcp, child_env, writer))
            proc.start()
            writer.close()
            procs.append(proc)
            conns[rank] = reader
        return _collect(procs, conns, timeout)
    finally:
        _reap(procs)
        for conn in conns.values():
            conn.close()


def _collect(procs: list[BaseProcess], conns: dict[int, multiprocessing.connection.Connection],
             timeout: float) -> list[Any]:
    """Wait for every rank's outcome; raise RanksFailed on the first failure (after a short wait)."""
    deadline = time.monotonic() + timeout
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    first_failure = math.inf
    open_conns = dict(conns)
    sentinels = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    while open_conns:
        deadline = min(deadline, first_failure + _AFTER_FAILURE_S)
        left = deadline - time.monotonic()
        if left <= 0:
            why = f"within {timeout:g} s" if not failures else f"within {_AFTER_FAILURE_S:g} s of that failure"
            for rank in open_conns:
                failures.setdefault(rank, f"rank {rank} did not finish {why} (killed)")
            break
        waitables: list[Any] = [*open_conns.values(), *(p.sentinel for r, p in enumerate(procs) if r in open_conns)]
        for ready in multiprocessing.connection.wait(waitables, timeout=left):
            rank = sentinels[ready] if isinstance(ready, int) else _rank_of(open_conns, ready)
            if rank not in open_conns:
                continue
            outcome = _read(open_conns[rank], procs[rank])
            del open_conns[rank]
            if outcome[0] == "ok":
                results[rank] = outcome[1]
            else:
                failures[rank] = outcome[1]
                first_failure = min(first_failure, time.monotonic())
    if failures:
        raise RanksFailed(_describe(failures), failures, results)
    return [results[r] for r in range(len(procs))]


def _rank_of(conns: dict[int, multiprocessing.connection.Connection], conn: Any) -> int:
    return next(rank for rank, c in conns.items() if c is conn)


def _read(conn: multiprocessing.connection.Connection, proc: BaseProcess) -> tuple[str, Any]:
    """The rank's ("ok", result) or ("error", text); a rank that died without reporting is an error."""
    try:
        if conn.poll(0.5):
            kind, value = conn.recv()
            return str(kind), value
    except (EOFError, OSError):
        pass
    proc.join(1.0)
    return "error", f"rank {proc.name.split('-')[-1]} exited without a result (exit code {proc.exitcode})"


def _describe(failures: dict[int, str]) -> str:
    parts = [f"--- rank {rank} ---\n{text.rstrip()}" for rank, text in failures.items()]
    return f"{len(failures)} rank(s) failed (first listed first):\n" + "\n".join(parts)


def _reap(procs: list[BaseProcess]) -> None:
    """Terminate, then kill, every process still running."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    end = time.monotonic() + _KILL_WAIT_S
    for proc in procs:
        proc.join(max(0.0, end - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(_KILL_WAIT_S)


def _child_main(fn: Callable[..., Any], args: tuple[Any, ...], layout: tuple[int, ...], port: int | None,
                force_tcp: bool, env: dict[str, str], conn: multiprocessing.connection.Connection) -> None:
    """Body of each rank's process: build the context, run ``fn``, report the outcome."""
    os.environ.update(env)
    from determined_trials.core import DistributedContext

    rank, size, local_rank, local_size, cross_rank, cross_size = layout
    try:
        with DistributedContext(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                                cross_rank=cross_rank, cross_size=cross_size, chief_ip="127.0.0.1",
                                pub_port=port, force_tcp=force_tcp) as dist:
            result = fn(dist, *args)
        outcome: tuple[str, Any] = ("ok", result)
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent as text
        outcome = ("error", traceback.format_exc())
    try:
        conn.send(outcome)
    except Exception:  # noqa: BLE001 - an unpicklable result
        conn.send(("error", f"rank {rank} returned an object that cannot be pickled:\n{traceback.format_exc()}"))
    conn.close()
