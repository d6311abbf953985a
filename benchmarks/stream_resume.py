"""Streams through det.pytorch.DataLoader: time from resume to the first batch, and the per-batch cost.

Usage: python benchmarks/stream_resume.py [--rounds 9] [--near 1000] [--deep 1000000] [--batches 3000] [--quick]

A stream of records made from their index (nothing in memory), batches of 32, one process. Resume: a
saved position at ``--near`` and at ``--deep`` records, for a stream that saves its position
(``state_dict``/``load_state_dict``: flat) and for one that cannot (replayed from the epoch's start:
grows with the position); each round times building the training stream, loading the position and
taking the first batch, both positions interleaved. Per batch: ``--batches`` batches through
det.pytorch.DataLoader's training stream vs torchdata's ``StatefulDataLoader`` (the loader it wraps) and
torch's ``DataLoader`` on the same stream: in each round the three take turns in blocks of 100 batches
(the first to go rotates); the median of the per-round ratios. And the training stream's own cost per
``next()``, over a loader whose batches cost nothing. ``--quick``: a few
seconds' smoke run (2 rounds, small positions, 100 batches).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from determined_trials import pytorch
from determined_trials.pytorch.data._iterable import StreamOfPasses, stateful_loader
from determined_trials.pytorch.data._loader import StreamReplayWarning

__all__ = ["main"]

BATCH = 32
BLOCK = 100  # batches each loader takes per turn in a round


class _Plain(torch.utils.data.IterableDataset[Any]):
    """Records made from their index, forever-length ``n``; cannot save its position."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (torch.full((4,), float(i % 97)) for i in range(self.n))


class _Stateful(_Plain):
    """The same records; saves its position."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.next_index, self._loaded = 0, False

    def __iter__(self) -> Iterator[torch.Tensor]:
        if not self._loaded:
            self.next_index = 0
        self._loaded = False
        return self._records()

    def _records(self) -> Iterator[torch.Tensor]:
        while self.next_index < self.n:
            i = self.next_index
            self.next_index += 1
            yield torch.full((4,), float(i % 97))

    def state_dict(self) -> dict[str, int]:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_index, self._loaded = state["next_index"], True


def _stream(dataset: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StreamReplayWarning)
        return pytorch.DataLoader(dataset, batch_size=BATCH).build_training_stream(seed=0)


def _position(dataset_cls: type, n: int, records: int) -> dict[str, Any]:
    """The saved position of a stream after ``records`` records (a real state, its counters moved on)."""
    stream = _stream(dataset_cls(n))
    next(stream)
    state = stream.state_dict()
    stream.close()
    batches = records // BATCH
    loader = state["loader"]
    loader["_num_yielded"] = loader["_sampler_iter_yielded"] = batches
    loader["_sampler_iter_state"] = {"samples_yielded": batches * BATCH}
    if loader.get("dataset_state") is not None:
        loader["dataset_state"] = {"next_index": batches * BATCH}
    state["in_epoch"] = batches
    return state


def _time_resume(dataset_cls: type, n: int, state: dict[str, Any]) -> float:
    start = time.perf_counter()
    stream = _stream(dataset_cls(n))
    stream.load_state_dict(state)
    next(stream)
    took = time.perf_counter() - start
    stream.close()
    return took


def _time_round(makers: dict[str, Callable[[], Iterator[Any]]], batches: int, first: int) -> dict[str, float]:
    """Seconds per batch of each loader in one round: the loaders take turns in blocks of ``BLOCK`` batches
    (the one that starts rotates with ``first``), so a change in the machine's load hits them alike."""
    names = list(makers)
    names = names[first % len(names):] + names[:first % len(names)]
    iterators = {name: makers[name]() for name in names}
    for iterator in iterators.values():
        next(iterator)  # started
    spent = dict.fromkeys(names, 0.0)
    for _ in range(max(1, batches // BLOCK)):
        for name in names:
            iterator = iterators[name]
            start = time.perf_counter()
            for _ in range(BLOCK):
                next(iterator)
            spent[name] += time.perf_counter() - start
    for iterator in iterators.values():
        getattr(iterator, "close", lambda: None)()
    return {name: took / (max(1, batches // BLOCK) * BLOCK) for name, took in spent.items()}


def _wrapper_ns(calls: int = 200_000) -> float:
    """Nanoseconds the training stream adds to each batch: its ``next()`` over a loader whose batches cost
    nothing (one object, repeated) minus that loader's own ``next()``."""
    loader = _FreeLoader()
    stream = StreamOfPasses(loader, loader, seed_of_epoch=lambda epoch: epoch)
    plain = iter(loader)
    best = {"stream": float("inf"), "plain": float("inf")}
    for _ in range(5):
        for name, iterator in (("stream", stream), ("plain", plain)):
            start = time.perf_counter()
            for _ in range(calls):
                next(iterator)
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    return (best["stream"] - best["plain"]) * 1e9


class _FreeLoader:
    """A loader whose batches cost nothing: one object, forever."""

    generator = None

    def __iter__(self) -> Iterator[Any]:
        return itertools.repeat(BATCH)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--near", type=int, default=1000)
    parser.add_argument("--deep", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds, positions 64/6400, 100 batches")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.near, args.deep, args.batches = 2, 64, 6400, BLOCK
    n = args.deep * 2
    resume: dict[str, dict[str, list[float]]] = {}
    for name, cls in (("state", _Stateful), ("replay", _Plain)):
        states = {"near": _position(cls, n, args.near), "deep": _position(cls, n, args.deep)}
        rounds = 3 if name == "replay" else args.rounds  # the replay of 1M records takes seconds a round
        times: dict[str, list[float]] = {"near": [], "deep": []}
        for _ in range(rounds):
            for where, state in states.items():
                times[where].append(_time_resume(cls, n, state))
        resume[name] = times
    size = ((max(1, args.batches // BLOCK) + 1) * BLOCK + 10) * BATCH
    makers: dict[str, Callable[[], Iterator[Any]]] = {
        "det": lambda: _stream(_Stateful(size)),
        "stateful": lambda: iter(stateful_loader(_Stateful(size), batch_size=BATCH, generator=torch.Generator())),
        "torch": lambda: iter(torch.utils.data.DataLoader(_Stateful(size), batch_size=BATCH)),
    }
    per_batch: dict[str, list[float]] = {name: [] for name in makers}
    for round_ in range(args.rounds):
        for name, took in _time_round(makers, args.batches, round_).items():
            per_batch[name].append(took)
    result = {
        "resume_s": {name: {where: statistics.median(t) for where, t in times.items()}
                     for name, times in resume.items()},
        "resume_deep_over_near": {name: statistics.median(t["deep"]) / statistics.median(t["near"])
                                  for name, t in resume.items()},
        "per_batch_us": {name: statistics.median(t) * 1e6 for name, t in per_batch.items()},
        "det_over_stateful": statistics.median(d / s for d, s in zip(per_batch["det"], per_batch["stateful"])),
        "det_over_stateful_rounds": sorted(round(d / s, 3) for d, s in zip(per_batch["det"], per_batch["stateful"])),
        "det_over_torch": statistics.median(d / s for d, s in zip(per_batch["det"], per_batch["torch"])),
        "stream_next_ns": _wrapper_ns(20_000 if args.quick else 200_000),
    }
    print(json.dumps(result, indent=1))
    print(f"per batch, det / StatefulDataLoader (median of {args.rounds} per-round ratios): "
          f"{result['det_over_stateful']:.3f}x; the stream's next() adds {result['stream_next_ns']:.0f} ns a batch")
    return result


if __name__ == "__main__":
    main()
