"""Thinning a metric series to at most N points while keeping its first and last points and its extremes."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["keep_indices"]


def keep_indices(values: Sequence[float], max_points: int) -> list[int]:
    """Indices of ``values`` to keep, in order, at most ``max_points`` of them (at least 2 when there are 2).

    The first and last points are always kept; the points between are cut into buckets and each bucket
    keeps its smallest and its largest value (min-max decimation), so every peak and dip, and the
    series' global minimum and maximum, survive.
    """
    n = len(values)
    limit = max(int(max_points), 2)
    if n <= limit:
        return list(range(n))
    buckets = (limit - 2) // 2
    if buckets == 0:
        return [0, n - 1]
    inner = n - 2
    kept = [0]
    for b in range(buckets):
        lo = 1 + (b * inner) // buckets
        hi = 1 + ((b + 1) * inner) // buckets
        if lo >= hi:
            continue
        low = min(range(lo, hi), key=values.__getitem__)
        high = max(range(lo, hi), key=values.__getitem__)
        kept.extend(sorted({low, high}))
    kept.append(n - 1)
    return kept
