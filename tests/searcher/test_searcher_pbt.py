"""PBT: Determined's pbt config accepted as is, the round rules (population held, the worst
floor(truncate_fraction × population) replaced by children of as many best), the explore function
(seeded, inside bounds, Determined's rounding), early exits and the state round trip."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
import yaml

from determined_trials.config import PBTSearcher, load_config
from determined_trials.errors import ConfigError
from determined_trials.searcher import PBTSearch, TrialRequest, explore_hparams, make_searcher

# Determined's end-to-end test config e2e_tests/tests/fixtures/no_op/pbt.yaml, unchanged.
DETERMINED_PBT_YAML = """\
description: noop_pbt
checkpoint_storage:
  type: shared_fs
  host_path: /tmp
  storage_path: determined-integration-checkpoints
hyperparameters:
  global_batch_size: 32
  metrics_progression: decreasing
  metrics_base:
    type: double
    minval: 0.5
    maxval: 0.9
  metrics_sigma: 0
searcher:
  name: pbt
  metric: validation_error
  population_size: 9
  length_per_round:
    batches: 600
  num_rounds: 3
  replace_function:
    truncate_fraction: 0.2
  explore_function:
    resample_probability: 0.2
    perturb_factor: 0.2
reproducibility:
  experiment_seed: 999
max_restarts: 0
entrypoint: model_def:NoOpTrial
"""

SPACE: dict[str, Any] = {
    "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1},
    "width": {"type": "int", "minval": 2, "maxval": 40},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "act": {"type": "categorical", "vals": ["relu", "tanh", "gelu"]},
    "opt": {"beta": {"type": "double", "minval": 0.8, "maxval": 0.99}, "name": "adam"},
    "fixed": {"type": "const", "val": 3},
}


def _pbt(population: int = 6, rounds: int = 4, truncate: float = 0.34, seed: int = 3, **explore: float) -> PBTSearch:
    raw = {
        "searcher": {
            "name": "pbt", "metric": "loss", "population_size": population, "num_rounds": rounds,
            "length_per_round": {"batches": 10}, "replace_function": {"truncate_fraction": truncate},
            "explore_function": {"resample_probability": explore.get("resample", 0.2),
                                 "perturb_factor": explore.get("perturb", 0.2)},
        },
        "hyperparameters": SPACE, "reproducibility": {"experiment_seed": seed},
    }
    made = make_searcher(load_config(raw))
    assert isinstance(made, PBTSearch)
    return made


def _metric(hparams: dict[str, Any]) -> float:
    return abs(math.log10(hparams["lr"]) + 2.5) + hparams["dropout"]


def test_determined_pbt_config_is_accepted_as_is() -> None:
    config = load_config(yaml.safe_load(DETERMINED_PBT_YAML))
    searcher = config.searcher
    assert isinstance(searcher, PBTSearcher)
    assert (searcher.population_size, searcher.num_rounds, searcher.metric) == (9, 3, "validation_error")
    assert searcher.replace_function.truncate_fraction == 0.2
    assert (searcher.explore_function.resample_probability, searcher.explore_function.perturb_factor) == (0.2, 0.2)
    assert str(searcher.length_per_round) == "600 batches" and str(searcher.max_length) == "1800 batches"
    assert load_config(config.as_dict()).searcher == searcher  # the snapshot round-trips
    made = make_searcher(config)
    assert isinstance(made, PBTSearch) and len(made.initial_trials()) == 9 and made.replaced_per_round == 1


@pytest.mark.parametrize(("change", "where"), [
    ({"population_size": 0}, "population_size"),
    ({"num_rounds": 0}, "num_rounds"),
    ({"replace_function": {"truncate_fraction": 1.5}}, "truncate_fraction"),
    ({"explore_function": {"resample_probability": -0.1, "perturb_factor": 0.2}}, "resample_probability"),
    ({"explore_function": {"resample_probability": 0.1, "perturb_factor": 2}}, "perturb_factor"),
    ({"explore_function": {"resample_probability": 0.1}}, "perturb_factor"),
    ({"length_per_round": 0}, "length_per_round"),
    ({"max_length": {"batches": 7}}, "max_length"),
])
def test_determined_checks_are_config_errors(change: dict[str, Any], where: str) -> None:
    raw = yaml.safe_load(DETERMINED_PBT_YAML)
    raw["searcher"].update(change)
    with pytest.raises(ConfigError, match=where):
        load_config(raw)


def _run(searcher: PBTSearch, order_seed: int = 0, exit_request: int | None = None) -> list[dict[str, Any]]:
    """Drive the search to its end (reports in a seeded order); returns one record per round."""
    order = random.Random(order_seed)
    requests: dict[int, TrialRequest] = {r.request_id: r for r in searcher.initial_trials()}
    rounds: list[dict[str, Any]] = []
    while not searcher.is_done():
        population = searcher.population
        assert len(population) == 6  # held every round
        ranked_before = {rid: _metric(requests[rid].hparams) for rid in population}
        due = [rid for rid in population if searcher.next_length(rid) is not None]
        order.shuffle(due)
        children: list[TrialRequest] = []
        for rid in due:
            length = searcher.next_length(rid)
            assert length == searcher.current_round * 10
            if rid == exit_request:
                children += searcher.on_trial_exited_early(rid)
                ranked_before[rid] = math.inf
            else:
                children += searcher.on_validation(rid, length, ranked_before[rid])
        requests.update({c.request_id: c for c in children})
        rounds.append({"population": population, "metrics": ranked_before, "children": children,
                       "next": searcher.population})
    return rounds


def test_rounds_hold_the_population_and_replace_the_worst_by_children_of_the_best() -> None:
    searcher = _pbt()
    rounds = _run(searcher)
    assert len(rounds) == 4
    for number, record in enumerate(rounds, start=1):
        ranked = sorted(record["population"], key=lambda rid: (record["metrics"][rid], rid))
        children = record["children"]
        if number == 4:
            assert children == [] and all(searcher.next_length(r) is None for r in record["population"])
            continue
        assert len(children) == 2 == math.floor(0.34 * 6)  # replaced = floor(truncate_fraction x population)
        assert [c.parent_request_id for c in children] == ranked[:2]  # one child of each of the 2 best
        assert all(c.search_round == number + 1 for c in children)
        assert set(record["next"]) == set(ranked[:4]) | {c.request_id for c in children}  # the worst 2 closed
        for child in children:  # a child continues its parent: same seed
            assert child.seed == next(m for m in searcher.state_dict()["members"]
                                      if m["request_id"] == child.parent_request_id)["seed"]
    assert searcher.progress() == 1.0 and len(searcher.state_dict()["members"]) == 6 + 3 * 2


def test_an_early_exit_ranks_worst_and_the_population_is_still_held() -> None:
    rounds = _run(_pbt(), exit_request=0)
    first = rounds[0]
    assert 0 not in first["next"] and all(c.parent_request_id != 0 for c in first["children"])
    assert all(len(r["next"]) == 6 for r in rounds[:-1])


def test_the_state_round_trip_continues_with_the_same_decisions() -> None:
    searcher = _pbt(seed=11)
    requests = {r.request_id: r for r in searcher.initial_trials()}
    for rid in list(requests)[:4]:  # the first round half reported
        searcher.on_validation(rid, 10, _metric(requests[rid].hparams))
    saved = json.loads(json.dumps(searcher.state_dict()))  # JSON, as the store keeps it
    twin = _pbt(seed=11)
    twin.load_state_dict(saved)
    assert twin.state_dict() == searcher.state_dict()
    assert [twin.waiting(r) for r in range(6)] == [True] * 4 + [False] * 2
    left = [(searcher.on_validation(rid, 10, _metric(requests[rid].hparams)),
             twin.on_validation(rid, 10, _metric(requests[rid].hparams))) for rid in (4, 5)]
    assert left[0] == ([], [])
    assert left[1][0] == left[1][1] and len(left[1][0]) == 2  # the same children, the same explored hparams
    with pytest.raises(ValueError, match="does not match"):
        _pbt(population=5).load_state_dict(saved)


def _parent(rng: random.Random) -> dict[str, Any]:
    from determined_trials.config import sample_hparams

    return sample_hparams(SPACE, rng)


def _inside(h: dict[str, Any]) -> None:
    assert 1e-4 <= h["lr"] <= 1e-1
    assert isinstance(h["width"], int) and 2 <= h["width"] <= 40
    assert 0.0 <= h["dropout"] <= 0.5 and 0.8 <= h["opt"]["beta"] <= 0.99
    assert h["act"] in ("relu", "tanh", "gelu") and h["fixed"] == 3 and h["opt"]["name"] == "adam"


@pytest.mark.parametrize("resample", [0.0, 0.3, 1.0])
def test_explore_stays_inside_the_bounds_and_is_seeded(resample: float) -> None:
    rng = random.Random(5)
    for _ in range(300):
        parent = _parent(rng)
        child = explore_hparams(SPACE, parent, rng, resample_probability=resample, perturb_factor=0.9)
        _inside(child)
    again = [explore_hparams(SPACE, _parent(random.Random(1)), random.Random(2), resample_probability=resample,
                             perturb_factor=0.2) for _ in range(2)]
    assert again[0] == again[1]


def test_explore_perturbs_by_determined_rule() -> None:
    rng = random.Random(8)
    parent = {"lr": 0.01, "width": 7, "dropout": 0.25, "act": "tanh", "opt": {"beta": 0.9, "name": "adam"}, "fixed": 3}
    moves: set[tuple[str, Any]] = set()
    for _ in range(200):
        child = explore_hparams(SPACE, parent, rng, resample_probability=0.0, perturb_factor=0.2)
        assert child["lr"] in (pytest.approx(0.008), pytest.approx(0.012))
        assert child["width"] in (5, 9)  # floor(7 x 0.8) = 5, ceil(7 x 1.2) = 9
        assert child["dropout"] in (pytest.approx(0.2), pytest.approx(0.3))
        assert child["opt"]["beta"] in (pytest.approx(0.8), pytest.approx(0.99))  # 0.72 and 1.08 clamped
        assert (child["act"], child["fixed"], child["opt"]["name"]) == ("tanh", 3, "adam")  # only a resample moves these
        moves.add(("width", child["width"]))
    assert moves == {("width", 5), ("width", 9)}  # both directions, by a fair coin
    edge = explore_hparams(SPACE, {**parent, "lr": 0.1, "width": 40}, random.Random(0), resample_probability=0.0,
                           perturb_factor=1.0)
    _inside(edge)  # x 2 or x 0 still inside the range
