"""Adaptive ASHA: rung lengths, the promotion rule, and a synthetic metric that is a known
function of the hparams (metric = |lr - 0.1| * 1000 / length)."""

from __future__ import annotations

from typing import Any

import pytest

from determined_trials.config import load_config
from determined_trials.searcher import (
    AdaptiveASHASearch,
    asha_rung_lengths,
    make_searcher,
    promotes,
)

LR_SPACE: dict[str, Any] = {"lr": {"type": "double", "minval": 0.0, "maxval": 0.2}}


def synthetic_metric(hparams: dict[str, Any], length: int) -> float:
    return abs(hparams["lr"] - 0.1) * 1000 / length


def _asha(**searcher: Any) -> AdaptiveASHASearch:
    raw = {"searcher": {"name": "adaptive_asha", "metric": "loss", **searcher},
           "hyperparameters": LR_SPACE, "reproducibility": {"experiment_seed": 21}}
    made = make_searcher(load_config(raw))
    assert isinstance(made, AdaptiveASHASearch)
    return made


@pytest.mark.parametrize(
    ("max_length", "divisor", "max_rungs", "expected"),
    [
        (64, 4, 5, [1, 4, 16, 64]),   # 5 rungs would start below 1: limited to 4
        (100, 4, 5, [1, 6, 25, 100]),  # floor(100 / 4**k)
        (10, 4, 5, [2, 10]),
        (1000, 10, 3, [10, 100, 1000]),
        (8, 2, 1, [8]),
        (1, 4, 5, [1]),
        (3, 1.1, 5, [2, 3]),           # coinciding floors are merged
    ],
)
def test_rung_lengths(max_length: int, divisor: float, max_rungs: int, expected: list[int]) -> None:
    assert asha_rung_lengths(max_length, divisor, max_rungs) == expected


def test_config_builds_rungs_and_initial_batch() -> None:
    searcher = _asha(max_length={"batches": 64}, max_trials=10, max_concurrent_trials=3, divisor=4, max_rungs=5)
    assert searcher.rung_lengths == [1, 4, 16, 64]
    first = searcher.initial_trials()
    assert [r.request_id for r in first] == [0, 1, 2]
    assert all(searcher.next_length(r.request_id) == 1 for r in first)


def test_promotion_rule_keeps_the_best_fraction_with_earlier_ties_first() -> None:
    entries = [(5.0, 0), (3.0, 1), (4.0, 2), (1.0, 3), (3.0, 4)]
    assert promotes(entries[:1], 0, 2, True)            # n=1: k = max(1, 0) = 1
    assert not promotes(entries[:3], 2, 2, True)        # n=3: k=1, best is 3.0
    assert promotes(entries[:4], 3, 2, True)            # n=4: k=2
    assert not promotes(entries, 4, 2, True)            # n=5: k=2, tie with trial 1 which reported first
    assert promotes(entries[:3], 0, 2, False)           # larger is better: 5.0 is the best
    assert not promotes([(float("nan"), 0), (1.0, 1)], 0, 2, True)  # NaN ranks last


def test_hand_worked_asha_run() -> None:
    s = _asha(max_length=4, max_trials=6, max_concurrent_trials=2, divisor=2, max_rungs=3)
    assert s.rung_lengths == [1, 2, 4]
    assert [r.request_id for r in s.initial_trials()] == [0, 1]
    steps: list[tuple[str, int, int, float, list[int], int | None]] = [
        # (event, trial, length, metric, new request ids, trial's next length)
        ("val", 0, 1, 5.0, [], 2),    # first at rung 0: promoted
        ("val", 1, 1, 3.0, [], 2),    # n=2, k=1, best: promoted
        ("val", 0, 2, 2.5, [], 4),
        ("val", 1, 2, 1.5, [], 4),
        ("val", 0, 4, 1.2, [2], None),  # top rung: completed, its slot goes to trial 2
        ("val", 2, 1, 4.0, [3], None),  # n=3, k=1, 3.0 is better: stopped
        ("val", 3, 1, 1.0, [], 2),      # n=4, k=2, best: promoted
        ("val", 1, 4, 0.7, [4], None),
        ("exit", 3, 0, 0.0, [5], None),  # early exit frees the slot
        ("val", 4, 1, 3.0, [], None),   # n=5, k=2: ties trial 1 but reported later: stopped
        ("val", 5, 1, 2.0, [], 2),      # n=6, k=3: promoted
        ("val", 5, 2, 0.1, [], 4),      # rung 1: n=3, k=1, best
    ]
    for event, rid, length, metric, new, nxt in steps:
        made = s.on_validation(rid, length, metric) if event == "val" else s.on_trial_exited_early(rid)
        assert [r.request_id for r in made] == new, (event, rid)
        assert s.next_length(rid) == nxt, (event, rid)
    assert not s.is_done()
    assert s.on_validation(5, 4, 0.05) == [] and s.is_done() and s.progress() == 1.0
    states = [s.trial_state(i) for i in range(6)]
    assert states == ["completed", "completed", "stopped", "exited", "stopped", "completed"]


def test_synthetic_metric_sequential_decisions() -> None:
    """One trial at a time: the decisions follow from the distances |lr - 0.1| alone."""
    s = _asha(max_length=64, max_trials=12, max_concurrent_trials=1, divisor=4, max_rungs=5)
    pending = s.initial_trials()
    reached: dict[int, int] = {}
    dists: dict[int, float] = {}
    while pending:
        req = pending.pop()
        dists[req.request_id] = abs(req.hparams["lr"] - 0.1)
        while (length := s.next_length(req.request_id)) is not None:
            reached[req.request_id] = length
            pending += s.on_validation(req.request_id, length, synthetic_metric(req.hparams, length))
    assert len(reached) == 12 and s.is_done()
    # Reference: trial i passes rung r iff its distance is among the best max(1, n // 4) of
    # the n trials that reached rung r so far (sequential, so in request order).
    expected: dict[int, int] = {}
    for rung, length in enumerate(s.rung_lengths):
        at_rung = [i for i in range(12) if rung == 0 or expected.get(i, 0) >= length]
        for pos, i in enumerate(at_rung):
            expected[i] = length
            seen = sorted(at_rung[: pos + 1], key=lambda j: (dists[j], j))
            if rung + 1 < len(s.rung_lengths) and i in seen[: max(1, (pos + 1) // 4)]:
                expected[i] = s.rung_lengths[rung + 1]
    assert reached == expected
    best = min(dists, key=lambda j: dists[j])
    assert reached[best] == 64 and reached[0] == 64  # the best and the first trial go all the way
    assert sum(1 for v in reached.values() if v == 1) >= 6  # most are stopped at rung 0


def test_larger_is_better_promotes_the_largest() -> None:
    s = _asha(max_length=4, max_trials=3, max_concurrent_trials=3, divisor=2, max_rungs=2,
              smaller_is_better=False)
    s.initial_trials()
    assert s.on_validation(0, 2, 0.5) == [] and s.next_length(0) == 4
    s.on_validation(1, 2, 0.9)
    assert s.next_length(1) == 4
    s.on_validation(2, 2, 0.1)
    assert s.next_length(2) is None


def test_mode_is_accepted_and_does_not_change_the_single_bracket() -> None:
    lengths = {m: _asha(max_length=16, max_trials=2, mode=m).rung_lengths for m in
               ("aggressive", "standard", "conservative")}
    assert len({tuple(v) for v in lengths.values()}) == 1


def test_stop_once_a_stopped_trial_is_never_promoted_later() -> None:
    """Determined's `stop_once: true`: trial 1 is stopped at its rung (n=2, k=1) and stays stopped when
    trial 3's report makes k=2 and trial 1 one of the two best."""
    search = _asha(max_length=16, max_trials=4, divisor=2, max_rungs=2, stop_once=True)
    assert search.rung_lengths == [8, 16]
    ids = [r.request_id for r in search.initial_trials()]
    for rid, metric in zip(ids, [1.0, 2.0, 3.0, 4.0]):
        search.on_validation(rid, 8, metric)
    assert [search.next_length(rid) for rid in ids] == [16, None, None, None]
    assert [search.trial_state(rid) for rid in ids[1:]] == ["stopped"] * 3
