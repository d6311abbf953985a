"""Rank bodies for tests/core/test_distributed.py, run in spawned processes by determined_trials.testing.run_ranks."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from typing import Any

from determined_trials.core import DistributedContext
from determined_trials.errors import CollectiveError

ROUNDS = 200


@dataclasses.dataclass(frozen=True)
class Payload:
    """A user-defined picklable object."""

    rank: int
    blob: bytes


def all_collectives(dist: Any) -> dict[str, Any]:
    """One of each collective, with assorted objects, then many rounds in a row."""
    r = dist.rank
    out: dict[str, Any] = {
        "layout": (dist.get_rank(), dist.get_size(), dist.get_local_rank(), dist.get_local_size(),
                   dist.get_cross_rank(), dist.get_num_agents()),
        "gather": dist.gather({"rank": r, "nested": [r, (r, None)], "set": {r}}),
        "allgather": dist.allgather(Payload(r, bytes([r]) * (1 << 20 if r == 1 else 10))),
        "broadcast": dist.broadcast({"from": r, "big": b"x" * 100_000} if r == 0 else None),
        "gather_local": dist.gather_local(r),
        "allgather_local": dist.allgather_local(r * 10),
        "broadcast_local": dist.broadcast_local(("local chief is", r) if dist.local_rank == 0 else "ignored"),
    }
    out["allgather"] = [(p.rank, len(p.blob), p.blob[:1]) for p in out["allgather"]]
    out["broadcast"] = (out["broadcast"]["from"], len(out["broadcast"]["big"]))
    ok = True
    for i in range(ROUNDS):
        ok &= dist.allgather(i * 100 + r) == [i * 100 + k for k in range(dist.size)]
        ok &= dist.broadcast(i if r == 0 else None) == i
        ok &= dist.allgather_local(i) == [i] * dist.local_size
        gathered = dist.gather(i)
        ok &= gathered is None if r else gathered == [i] * dist.size
    out["rounds_ok"] = ok
    return out


def gather_ahead(dist: Any) -> Any:
    """Workers gather many times while the chief is still busy; nothing is lost or reordered."""
    if dist.rank == 0:
        time.sleep(0.5)
    results = [dist.gather((dist.rank, i)) for i in range(300)]
    final = dist.allgather(dist.rank)
    return results if dist.rank == 0 else (results.count(None), final)


def job_token(dist: Any, token: str, seconds: float) -> list[str]:
    """Exchange this job's token for a while (two jobs run this at once)."""
    seen: set[str] = set()
    end = time.monotonic() + seconds
    while not dist.broadcast(time.monotonic() > end):  # the chief decides when to stop
        seen.update(dist.allgather(token))
    return sorted(seen)


def _expect_failure(dist: Any, call: str) -> tuple[str, float]:
    start = time.monotonic()
    try:
        getattr(dist, call)(dist.rank)
    except CollectiveError as exc:
        return str(exc), time.monotonic() - start
    return "no error", time.monotonic() - start


def dies_mid_run(dist: Any, victim: int, how: str) -> tuple[str, float] | None:
    """``victim`` vanishes after the first allgather (kill -9, exit without closing, or just returning);
    every other rank then calls allgather and must get a CollectiveError."""
    dist.allgather(dist.rank)
    if dist.rank == victim:
        time.sleep(0.3)  # a process killed at once may take its last, still unsent, message with it
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "exit":
            os._exit(0)
        return None  # "return": run_ranks closes the context, the peers see it leave
    return _expect_failure(dist, "allgather")


def dies_in_local(dist: Any, victim: int) -> Any:
    """``victim`` is killed between two allgather_local calls; its agent's local chief must name it."""
    dist.allgather_local(dist.rank)
    if dist.rank == victim:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    if dist.cross_rank != victim // dist.local_size:
        return dist.allgather_local(dist.rank)
    return _expect_failure(dist, "allgather_local")


def hangs(dist: Any, sleeper: int, timeout: float, flag: str) -> tuple[str, float]:
    """``sleeper`` hangs at an allgather until rank 0 failed on it (``flag`` written); the others time out
    after ``timeout`` s and name it. The short timeout is that of a second context opened once every rank
    is up: the start-up of spawned processes on a loaded machine may take longer than it."""
    dist.allgather(0)  # every rank is up (under the run's long timeout)
    os.environ["DET_JOB_ID"] += "-short"  # its own sockets
    with DistributedContext(rank=dist.get_rank(), size=dist.get_size(), local_rank=dist.get_local_rank(),
                            local_size=dist.get_local_size(), cross_rank=dist.get_cross_rank(),
                            cross_size=dist.get_num_agents(), chief_ip="127.0.0.1", timeout=timeout) as short:
        short.allgather(0)
        if short.rank == sleeper:
            deadline = time.monotonic() + 300
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.01)
        result = _expect_failure(short, "allgather")
        if short.rank == 0:
            with open(flag, "w") as out:
                out.write("rank 0 failed\n")
        return result


def diverges(dist: Any) -> tuple[str, float]:
    """The chief calls gather where the workers call broadcast."""
    return _expect_failure(dist, "gather" if dist.rank == 0 else "broadcast")


def signals(dist: Any, from_thread: bool) -> tuple[bool, bool, list[int]]:
    """Rank 1 sends a preemption signal; the chief sees it, and the collectives' order is unharmed."""
    before = dist._chief_poll_worker_signals() if dist.rank == 0 else False
    dist.allgather(None)
    if dist.rank == 1:
        if from_thread:
            sender = threading.Thread(target=dist._worker_send_signal)
            sender.start()
            sender.join()
        else:
            dist._worker_send_signal()
    seen = False
    for _ in range(100):
        dist.broadcast(None)
        if dist.rank == 0 and not seen:
            seen = dist._chief_poll_worker_signals()
            if not seen:
                time.sleep(0.02)
    seen = dist.broadcast(seen)
    return before, seen, dist.allgather(dist.rank)


def from_env(dist: Any, factory: str, job_id: str) -> tuple[tuple[int, ...], list[int]]:
    """Build a second context through a factory, from the variables its launcher would set."""
    r, n = dist.rank, dist.size
    variables = {"RANK": r, "WORLD_SIZE": n, "LOCAL_RANK": r}
    variables.update({"LOCAL_WORLD_SIZE": n, "GROUP_RANK": 0, "GROUP_WORLD_SIZE": 1} if factory == "torch"
                     else {"LOCAL_SIZE": n, "CROSS_RANK": 0, "CROSS_SIZE": 1})
    os.environ.update({k: str(v) for k, v in variables.items()})
    os.environ["DET_JOB_ID"] = job_id
    cls = type(dist)
    other = cls.from_torch_distributed() if factory == "torch" else cls.from_deepspeed()
    with other:
        layout = (other.rank, other.size, other.local_rank, other.local_size, other.cross_rank, other.cross_size)
        return layout, other.allgather(other.rank * 7)


def reopens(dist: Any, times: int) -> list[int]:
    """Open and close further contexts at one address, one after another, as fast as possible."""
    os.environ["DET_JOB_ID"] += "-inner"  # the outer context still holds the job's own address
    sums = []
    for i in range(times):
        with type(dist)(rank=dist.rank, size=dist.size, local_rank=dist.local_rank, local_size=dist.local_size,
                        cross_rank=dist.cross_rank, cross_size=dist.cross_size, chief_ip="127.0.0.1") as again:
            sums.append(sum(again.allgather(i)))
            if again.rank == 0:
                time.sleep(0.2)  # the workers' next hello reaches this closing chief first
    return sums


def fails_on(dist: Any, rank: int) -> int:
    """Raise on ``rank`` (run_ranks must report its traceback)."""
    if dist.rank == rank:
        raise ValueError(f"boom on rank {rank}")
    return dist.rank


def sleeps(dist: Any, seconds: float, pid_dir: str) -> int:
    """Writes its pid, then takes longer than the test's run_ranks timeout."""
    with open(os.path.join(pid_dir, f"rank{dist.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)
    return os.getpid()


def pid(dist: Any) -> int:
    """This rank's process id."""
    return os.getpid()
