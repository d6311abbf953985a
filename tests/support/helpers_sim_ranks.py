"""Simulated ranks for the cross-rank reduction tests: a real one-process DistributedContext, and
several ranks as threads of this process whose allgather meets at a barrier (collectives counted)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from determined_trials.core import DistributedContext
from determined_trials.loop import reduce_across_ranks
from determined_trials.pytorch.metrics._reducer import ReducerRegistry

__all__ = ["ONE_RANK", "SimulatedRanks", "reduce_one"]

T = TypeVar("T")

ONE_RANK = DistributedContext(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)


def reduce_one(metrics: Any, registry: ReducerRegistry | None = None, training: bool = True) -> dict[str, Any]:
    """The adapters' reduction of ``metrics`` (and ``registry``'s reducers) on a single process."""
    return reduce_across_ranks(ONE_RANK, metrics, registry or ReducerRegistry(), training)[0]


class _RankDist:
    """What the reduction reads of a DistributedContext, for one simulated rank."""

    def __init__(self, ranks: SimulatedRanks, rank: int) -> None:
        self._ranks, self._rank = ranks, rank

    def get_size(self) -> int:
        return self._ranks.size

    def get_rank(self) -> int:
        return self._rank

    def allgather(self, payload: Any) -> list[Any]:
        return self._ranks._allgather(self._rank, payload)


class SimulatedRanks:
    """``size`` ranks run as threads; ``collectives[r]`` counts rank r's allgathers."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.collectives = [0] * size
        self._slots: list[Any] = [None] * size
        self._barrier = threading.Barrier(size, timeout=60)

    def run(self, bodies: Sequence[Callable[[Any], T]]) -> list[T]:
        """Run ``bodies[r](dist_of_rank_r)`` on every rank at once; their results in rank order."""
        assert len(bodies) == self.size
        with ThreadPoolExecutor(self.size) as pool:
            futures = [pool.submit(body, _RankDist(self, rank)) for rank, body in enumerate(bodies)]
            return [future.result() for future in futures]

    def _allgather(self, rank: int, payload: Any) -> list[Any]:
        self.collectives[rank] += 1
        self._slots[rank] = payload
        self._barrier.wait()
        gathered = list(self._slots)
        self._barrier.wait()  # every rank has read the slots before any writes the next round
        return gathered
