"""The machine's load as the tests measure it in the same run: ``load_factor()`` scales time limits (the
per-test timeout, a few wall-time bounds) on a shared machine whose cores other work takes."""

from __future__ import annotations

import os

__all__ = ["MAX_LOAD_FACTOR", "load_factor"]

MAX_LOAD_FACTOR = 4.0
"""No bound grows more than this: a test that takes 4× its limit on a loaded machine is still a failure."""


def load_factor() -> float:
    """Runnable processes per core over the last minute, at least 1 (an idle or normally busy machine) and
    at most ``MAX_LOAD_FACTOR``: at load 6 on 2 cores a bound is 3× what a quiet machine needs."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average (not a Unix): the bounds as written
        return 1.0
    return min(max(load / cores, 1.0), MAX_LOAD_FACTOR)
