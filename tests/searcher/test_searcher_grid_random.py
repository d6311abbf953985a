"""Searchers without promotion: single, grid and random (expansion, values, seeds, slots)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from determined_trials.config import load_config, sample_hparams
from determined_trials.searcher import (
    GridSearch,
    RandomSearch,
    Searcher,
    SingleSearch,
    make_searcher,
    trial_seed,
)

SPACE: dict[str, Any] = {
    "lr": {"type": "log", "base": 10, "minval": -3, "maxval": -1, "count": 3},
    "layers": {"type": "int", "minval": 1, "maxval": 4, "count": 2},
    "act": {"type": "categorical", "vals": ["relu", "tanh"]},
    "opt": {"momentum": {"type": "double", "minval": 0.0, "maxval": 0.5, "count": 2}, "name": "sgd"},
    "batch": 32,
}


def _config(searcher: dict[str, Any], space: dict[str, Any] | None = None, seed: int | None = 11) -> Any:
    raw: dict[str, Any] = {"searcher": {"metric": "loss", **searcher}, "hyperparameters": space or SPACE}
    if seed is not None:
        raw["reproducibility"] = {"experiment_seed": seed}
    return load_config(raw)


def _finish_all(searcher: Searcher) -> list[Any]:
    """Complete every trial in request order; return every request made."""
    made = list(searcher.initial_trials())
    done = 0
    while done < len(made):
        req = made[done]
        length = searcher.next_length(req.request_id)
        assert length is not None
        made += searcher.on_validation(req.request_id, length, 1.0)
        assert searcher.next_length(req.request_id) is None
        done += 1
    return made


def test_grid_expands_every_combination_with_log_int_and_nested_values() -> None:
    searcher = make_searcher(_config({"name": "grid", "max_length": {"batches": 7}}))
    assert isinstance(searcher, GridSearch)
    made = _finish_all(searcher)
    assert len(made) == 3 * 2 * 2 * 2
    lrs = sorted({r.hparams["lr"] for r in made})
    assert lrs == pytest.approx([1e-3, 1e-2, 1e-1])
    assert {r.hparams["layers"] for r in made} == {1, 4}
    assert all(isinstance(r.hparams["layers"], int) for r in made)
    assert {r.hparams["act"] for r in made} == {"relu", "tanh"}
    assert {r.hparams["opt"]["momentum"] for r in made} == {0.0, 0.5}
    assert all(r.hparams["opt"]["name"] == "sgd" and r.hparams["batch"] == 32 for r in made)
    assert len({repr(sorted(r.hparams.items())) for r in made}) == len(made)
    assert made[0].hparams["lr"] == pytest.approx(1e-3) and made[-1].hparams["lr"] == pytest.approx(1e-1)
    assert searcher.is_done() and searcher.progress() == 1.0


def test_grid_int_count_is_capped_and_deduplicated_and_count_one_is_the_midpoint() -> None:
    space = {"n": {"type": "int", "minval": 1, "maxval": 3, "count": 10}, "x": {"type": "double",
             "minval": 0.0, "maxval": 1.0, "count": 1}}
    made = _finish_all(make_searcher(_config({"name": "grid", "max_length": 2}, space)))
    assert [r.hparams for r in made] == [{"n": 1, "x": 0.5}, {"n": 2, "x": 0.5}, {"n": 3, "x": 0.5}]


def test_grid_respects_concurrency_and_lengths() -> None:
    searcher = make_searcher(_config({"name": "grid", "max_length": 5, "max_concurrent_trials": 3}))
    first = searcher.initial_trials()
    assert [r.request_id for r in first] == [0, 1, 2]
    assert searcher.initial_trials() == []  # no free slot, no new trial
    assert all(searcher.next_length(r.request_id) == 5 for r in first)
    assert searcher.on_validation(0, 4, 1.0) == []  # below max_length: not a completed op
    new = searcher.on_validation(0, 5, 1.0)
    assert [r.request_id for r in new] == [3]
    assert [r.request_id for r in searcher.on_trial_exited_early(1)] == [4]
    assert searcher.next_length(1) is None and searcher.next_length(0) is None
    assert not searcher.is_done()


def test_random_counts_ranges_and_trial_seeds() -> None:
    space = {"lr": {"type": "log", "minval": -4, "maxval": -1}, "units": {"type": "int", "minval": 8,
             "maxval": 64}, "drop": {"type": "double", "minval": 0.1, "maxval": 0.3},
             "act": {"type": "categorical", "vals": ["a", "b"]}}
    searcher = make_searcher(_config({"name": "random", "max_trials": 9, "max_length": 3}, space))
    assert isinstance(searcher, RandomSearch)
    made = _finish_all(searcher)
    assert len(made) == 9 and [r.request_id for r in made] == list(range(9))
    for r in made:
        assert 1e-4 <= r.hparams["lr"] <= 1e-1
        assert 8 <= r.hparams["units"] <= 64 and isinstance(r.hparams["units"], int)
        assert 0.1 <= r.hparams["drop"] <= 0.3 and r.hparams["act"] in ("a", "b")
        assert r.seed == trial_seed(11, r.request_id) and 0 <= r.seed < 2**31 - 1
    assert len({r.seed for r in made}) == 9
    assert len({r.hparams["lr"] for r in made}) == 9
    rng = random.Random(11)
    assert [r.hparams for r in made] == [sample_hparams(space, rng) for _ in range(9)]


def test_random_same_seed_same_hparams_and_different_seed_different() -> None:
    def draw(seed: int) -> list[Any]:
        return [(r.hparams, r.seed) for r in _finish_all(
            make_searcher(_config({"name": "random", "max_trials": 5, "max_length": 1}, seed=seed)))]

    assert draw(3) == draw(3)
    assert [h for h, _ in draw(3)] != [h for h, _ in draw(4)]
    assert [s for _, s in draw(3)] != [s for _, s in draw(4)]


def test_random_concurrency_and_early_exit_count_towards_max_trials() -> None:
    searcher = make_searcher(_config({"name": "random", "max_trials": 4, "max_length": 2,
                                      "max_concurrent_trials": 2}))
    assert [r.request_id for r in searcher.initial_trials()] == [0, 1]
    assert [r.request_id for r in searcher.on_trial_exited_early(0)] == [2]
    assert [r.request_id for r in searcher.on_validation(1, 2, 0.5)] == [3]
    assert searcher.on_validation(2, 2, 0.5) == [] and searcher.on_validation(3, 2, 0.5) == []
    assert searcher.is_done()


def test_single_is_one_trial_with_the_seeded_sample() -> None:
    space = {"lr": {"type": "double", "minval": 0.0, "maxval": 1.0}}
    searcher = make_searcher(_config({"name": "single", "max_length": {"epochs": 4}}, space, seed=5))
    assert isinstance(searcher, SingleSearch)
    (req,) = searcher.initial_trials()
    assert req.hparams == sample_hparams(space, random.Random(5))
    assert searcher.next_length(req.request_id) == 4 and searcher.progress() == 0.0
    assert searcher.on_validation(req.request_id, 4, 0.1) == []
    assert searcher.is_done() and searcher.progress() == 1.0


def test_progress_counts_reported_lengths_and_finished_trials() -> None:
    searcher = make_searcher(_config({"name": "random", "max_trials": 2, "max_length": 10}))
    searcher.initial_trials()
    searcher.on_validation(0, 5, 1.0)  # halfway, not yet complete
    assert searcher.progress() == pytest.approx(0.25)
    searcher.on_validation(0, 10, 1.0)
    assert searcher.progress() == pytest.approx(0.5)
    searcher.on_trial_exited_early(1)
    assert searcher.is_done() and searcher.progress() == 1.0


def test_seed_comes_from_argument_then_config_then_is_random_and_kept() -> None:
    cfg = _config({"name": "random", "max_trials": 1, "max_length": 1}, seed=None)
    a, b = make_searcher(cfg), make_searcher(cfg)
    assert isinstance(a, RandomSearch) and isinstance(b, RandomSearch)
    assert 0 <= a.experiment_seed < 2**31
    restored = make_searcher(cfg)
    restored.load_state_dict(a.state_dict())
    assert restored.initial_trials() == a.initial_trials()
    fixed = make_searcher(cfg, experiment_seed=9)
    assert isinstance(fixed, RandomSearch) and fixed.experiment_seed == 9


def test_unknown_request_id_is_a_clear_error() -> None:
    searcher = SingleSearch({}, max_length=1, experiment_seed=0)
    with pytest.raises(KeyError, match="no trial with request id 3"):
        searcher.next_length(3)
    assert not math.isnan(searcher.progress())
