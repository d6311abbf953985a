"""The 2-rank per-batch benchmarks' rounds: a round's batch times, and the median of per-round ratios with a
bootstrap interval for it."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence

__all__ = ["WARM", "BatchTimes", "Timed", "median_interval", "run_rounds", "summary"]

WARM = 2  # batches before the timed span (the first allocates the optimizer state)


class BatchTimes:
    """Each batch's start (wall clock and the process's CPU time, all threads) and the seconds it spent in the
    model's calls (forward, backward, optimizer step)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.cpu_starts: list[float] = []
        self.inside: list[float] = []

    def start(self) -> float:
        """Note a batch's start; returns its wall-clock time."""
        self.cpu_starts.append(time.process_time())
        self.starts.append(time.perf_counter())
        return self.starts[-1]

    def per_batch(self) -> tuple[float, float, float]:
        """(seconds per batch, of which outside the model's calls, CPU seconds per batch of all the process's
        threads) from the start of batch WARM to the start of the last one."""
        n = len(self.starts) - 1 - WARM
        total = (self.starts[-1] - self.starts[WARM]) / n
        return total, total - sum(self.inside[WARM:-1]) / n, (self.cpu_starts[-1] - self.cpu_starts[WARM]) / n


def median_interval(values: Sequence[float], confidence: float = 0.95, resamples: int = 10_000,
                    seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap interval of the median of ``values`` (per-round ratios): the medians of
    ``resamples`` resamplings with replacement, cut at ``(1 - confidence) / 2`` at each end. Seeded, so the same
    rounds always give the same interval. With one value the interval is that value."""
    if not values:
        raise ValueError("median_interval needs at least one value")
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    cut = int(resamples * (1 - confidence) / 2)
    return medians[cut], medians[-1 - cut]


Timed = tuple[float, float, float]  # BatchTimes.per_batch(): wall, of which outside the calls, CPU (seconds a batch)
_KEYS = ("harness", "raw", "ratio", "harness_outside", "raw_outside", "harness_cpu", "raw_cpu")


def run_rounds(rounds: int, harness: Callable[[int], Timed], raw: Callable[[], Timed], calls: str,
               *, show: bool) -> dict[str, list[float]]:
    """Time ``harness(round)`` and ``raw()`` once a round, in an order that alternates between rounds; each row
    by round. ``show``: print one line a round (rank 0), naming the model's ``calls``."""
    rows: dict[str, list[float]] = {k: [] for k in _KEYS}
    for rnd in range(rounds):
        step: dict[str, Timed] = {}
        for kind in (("harness", "raw") if rnd % 2 == 0 else ("raw", "harness")):
            step[kind] = harness(rnd) if kind == "harness" else raw()
        (fit, fit_out, fit_cpu), (plain, plain_out, plain_cpu) = step["harness"], step["raw"]
        for key, value in zip(_KEYS, (fit, plain, fit / plain, fit_out, plain_out, fit_cpu, plain_cpu), strict=True):
            rows[key].append(value)
        if show:
            print(f"round {rnd + 1}/{rounds}: Trainer.fit {fit * 1e3:.1f} ms/batch ({fit_out * 1e3:.2f} outside the "
                  f"{calls}), raw loop {plain * 1e3:.1f} ms/batch ({plain_out * 1e3:.2f}), ratio {fit / plain:.3f}",
                  flush=True)
    return rows


def summary(rows: dict[str, list[float]], raw_name: str, calls: str) -> str:
    """The medians' line: per batch, the ratio with its interval and the rounds' range, the time outside the
    model's ``calls`` and the CPU time of all threads (background threads included)."""
    med = {k: statistics.median(v) for k, v in rows.items()}
    low, high = median_interval(rows["ratio"])
    return (f"medians: Trainer.fit {med['harness'] * 1e3:.1f} ms/batch, {raw_name} {med['raw'] * 1e3:.1f} ms/batch; "
            f"Trainer.fit / raw (median of per-round ratios): {med['ratio']:.3f} (95 % interval of the median "
            f"{low:.3f}-{high:.3f}; rounds {min(rows['ratio']):.3f}-{max(rows['ratio']):.3f}); outside the {calls} "
            f"(data, loop, harness): Trainer.fit {med['harness_outside'] * 1e3:.2f} ms/batch, raw "
            f"{med['raw_outside'] * 1e3:.2f} ms/batch; CPU of all threads: Trainer.fit {med['harness_cpu'] * 1e3:.1f} "
            f"ms/batch, raw {med['raw_cpu'] * 1e3:.1f} ms/batch")
