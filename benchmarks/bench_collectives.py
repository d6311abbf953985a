"""Latency of DistributedContext collectives between real processes on this host.

Usage: python benchmarks/bench_collectives.py [--size 2] [--local-size N] [--rounds 1000]
Prints the median and 99th percentile, in microseconds, of: allgather of a small dict (time on each
rank), broadcast one way (chief's send to a worker's receipt, ranks in step), and gather on the chief.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from determined_trials.testing import run_ranks


def _stats(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples) * 1e6, samples[int(len(samples) * 0.99) - 1] * 1e6


def _bench(dist: Any, rounds: int) -> dict[str, tuple[float, float]]:
    for i in range(50):  # warm up
        dist.allgather({"i": i})
    allgather, broadcast, gather = [], [], []
    for i in range(rounds):
        t = time.perf_counter()
        dist.allgather({"step": i, "loss": 0.5})
        allgather.append(time.perf_counter() - t)
    for _ in range(rounds):
        dist.allgather(None)  # keep the ranks in step so the broadcast is not pipelined
        sent = dist.broadcast(time.perf_counter() if dist.rank == 0 else None)
        broadcast.append(time.perf_counter() - sent)
    for i in range(rounds):
        dist.allgather(None)
        t = time.perf_counter()
        dist.gather({"step": i})
        gather.append(time.perf_counter() - t)
    out = {"allgather": _stats(allgather), "gather": _stats(gather)}
    if dist.rank != 0:
        out["broadcast one-way"] = _stats(broadcast)
    return out


def main() -> None:
    """Run the benchmark and print one line per rank."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2)
    parser.add_argument("--local-size", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=1000)
    args = parser.parse_args()
    results = run_ranks(_bench, args.size, local_size=args.local_size, args=(args.rounds,), timeout=300)
    for rank, res in enumerate(results):
        line = ", ".join(f"{name} median {med:.0f} us (p99 {p99:.0f})" for name, (med, p99) in res.items())
        print(f"rank {rank}: {line}")


if __name__ == "__main__":
    main()
