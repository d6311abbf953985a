"""Searchers driven by a small fake runner: concurrency limit, early exits freeing slots, and
`state_dict()` round trips mid-search giving the same later decisions."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from determined_trials.config import load_config
from determined_trials.searcher import Searcher, TrialRequest, make_searcher


def synthetic_metric(hparams: dict[str, Any], length: int) -> float:
    return abs(hparams["lr"] - 0.1) * 1000 / length


class FakeRunner:
    """Runs the searcher's trials, reporting (or exiting) one trial per step in a seeded order."""

    def __init__(self, searcher: Searcher, events_seed: int, exit_prob: float = 0.0) -> None:
        self.searcher = searcher
        self.events = random.Random(events_seed)
        self.exit_prob = exit_prob
        self.pending: dict[int, TrialRequest] = {}
        self.created: list[TrialRequest] = []
        self.log: list[tuple[Any, ...]] = []
        self.max_running = 0
        self.exits = 0

    def start(self) -> None:
        self._add(self.searcher.initial_trials())

    def _add(self, requests: list[TrialRequest]) -> None:
        for req in requests:
            assert req.request_id not in self.pending
            self.pending[req.request_id] = req
            self.created.append(req)
        self.max_running = max(self.max_running, len(self.pending))

    def step(self) -> None:
        rid = self.events.choice(sorted(self.pending))
        length = self.searcher.next_length(rid)
        assert length is not None
        if self.events.random() < self.exit_prob:
            new = self.searcher.on_trial_exited_early(rid)
            self.pending.pop(rid)
            self.exits += 1
        else:
            new = self.searcher.on_validation(rid, length, synthetic_metric(self.pending[rid].hparams, length))
            if self.searcher.next_length(rid) is None:
                self.pending.pop(rid)
        self.log.append((rid, length, self.searcher.next_length(rid), [(r.request_id, r.hparams, r.seed)
                                                                      for r in new]))
        self._add(new)

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.pending:
                return
            before = self.searcher.progress()
            self.step()
            assert self.searcher.progress() >= before
        raise AssertionError("the search did not finish")


def _searcher(name: str, seed: int = 5, **extra: Any) -> Searcher:
    searcher: dict[str, Any] = {"name": name, "metric": "loss", "max_length": 64, **extra}
    space: dict[str, Any] = {"lr": {"type": "double", "minval": 0.0, "maxval": 0.2}}
    if name == "grid":
        space = {"lr": {"type": "double", "minval": 0.0, "maxval": 0.2, "count": 9}}
    raw = {"searcher": searcher, "hyperparameters": space, "reproducibility": {"experiment_seed": seed}}
    return make_searcher(load_config(raw))


ASHA = {"max_trials": 20, "max_concurrent_trials": 3, "divisor": 2, "max_rungs": 4}


@pytest.mark.parametrize("exit_prob", [0.0, 0.2])
@pytest.mark.parametrize(("name", "extra", "total"), [
    ("adaptive_asha", ASHA, 20),
    ("random", {"max_trials": 7, "max_concurrent_trials": 2}, 7),
    ("grid", {"max_concurrent_trials": 4}, 9),
])
def test_runner_loop_respects_limits_and_finishes(name: str, extra: dict[str, Any], total: int,
                                                  exit_prob: float) -> None:
    searcher = _searcher(name, **extra)
    runner = FakeRunner(searcher, events_seed=3, exit_prob=exit_prob)
    runner.start()
    assert len(runner.pending) == extra["max_concurrent_trials"]
    runner.run()
    assert runner.max_running == extra["max_concurrent_trials"]
    assert len(runner.created) == total and searcher.is_done() and searcher.progress() == 1.0
    assert [r.request_id for r in runner.created] == list(range(total))
    assert (runner.exits > 0) == (exit_prob > 0)  # exited trials still count towards the total


def test_asha_concurrent_run_promotes_few_and_runs_the_best_to_the_end() -> None:
    searcher = _searcher("adaptive_asha", **ASHA)
    runner = FakeRunner(searcher, events_seed=8)
    runner.start()
    runner.run()
    final = {rid: length for rid, length, nxt, _ in runner.log if nxt is None}
    assert len(final) == 20
    assert set(final.values()) <= {8, 16, 32, 64}  # rungs of max_length 64, divisor 2, 4 rungs
    assert sum(1 for v in final.values() if v == 8) > sum(1 for v in final.values() if v == 64)
    best = min(runner.created, key=lambda r: abs(r.hparams["lr"] - 0.1))
    assert final[best.request_id] == 64


@pytest.mark.parametrize(("name", "extra"), [
    ("adaptive_asha", ASHA), ("random", {"max_trials": 8, "max_concurrent_trials": 3}),
    ("grid", {"max_concurrent_trials": 2}),
])
@pytest.mark.parametrize("cut", [0, 5, 17])
def test_state_dict_round_trip_mid_search_gives_the_same_decisions(name: str, extra: dict[str, Any],
                                                                   cut: int) -> None:
    uninterrupted = FakeRunner(_searcher(name, **extra), events_seed=4, exit_prob=0.1)
    uninterrupted.start()
    uninterrupted.run()

    first = FakeRunner(_searcher(name, **extra), events_seed=4, exit_prob=0.1)
    first.start()
    for _ in range(min(cut, len(uninterrupted.log) - 1)):
        first.step()
    saved = json.loads(json.dumps(first.searcher.state_dict()))
    events_state = first.events.getstate()

    # A fresh process: a searcher built from the same config but another seed, then the state.
    restored = _searcher(name, seed=999, **extra)
    restored.load_state_dict(saved)
    assert restored.initial_trials() == []  # the pending trials already exist in the runner
    assert restored.progress() == first.searcher.progress()
    second = FakeRunner(restored, events_seed=0, exit_prob=0.1)
    second.events.setstate(events_state)
    second.pending = dict(first.pending)
    second.run()
    assert first.log + second.log == uninterrupted.log


def test_load_state_dict_rejects_a_state_from_another_config() -> None:
    state = _searcher("adaptive_asha", **ASHA).state_dict()
    other = _searcher("adaptive_asha", **{**ASHA, "max_trials": 21})
    with pytest.raises(ValueError, match="does not match the searcher built from the config"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="does not match"):
        _searcher("random", max_trials=20).load_state_dict(state)
