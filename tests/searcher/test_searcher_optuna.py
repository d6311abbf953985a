"""The optuna searcher driven in-process: every hyperparameter type through every sampler (or its refusal),
ask/tell counts, the concurrency limit, seeding, pruning at rungs, and a study rebuilt from the saved state after
its runner was killed."""

from __future__ import annotations

import importlib.util
import json
import math
import random
from typing import Any

import pytest

from determined_trials.config import load_config
from determined_trials.errors import ConfigError
from determined_trials.searcher import OptunaSearch, TrialRequest, make_searcher, param_importances

optuna = pytest.importorskip("optuna")

SPACE: dict[str, Any] = {
    "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1},
    "layers": {"type": "int", "minval": 1, "maxval": 4},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "opt": {"name": {"type": "categorical", "vals": ["adam", "sgd"]}, "sizes": {"type": "categorical",
                                                                               "vals": [[8, 8], [16]]}},
    "tag": {"type": "const", "val": {"k": [1]}},
    "plain": 3,
}
NUMERIC = {k: SPACE[k] for k in ("lr", "layers", "dropout", "tag", "plain")}
SAMPLERS = ["tpe", "gp", "qmc", "random", "cmaes"]


def _optuna(space: dict[str, Any] = SPACE, seed: int = 11, **searcher: Any) -> OptunaSearch:
    raw = {"searcher": {"name": "optuna", "metric": "loss", "max_length": 8, "max_trials": 12,
                        "max_concurrent_trials": 1, **searcher},
           "hyperparameters": space, "reproducibility": {"experiment_seed": seed}}
    made = make_searcher(load_config(raw))
    assert isinstance(made, OptunaSearch)
    return made


def _metric(hp: dict[str, Any], length: int) -> float:
    return (math.log10(hp["lr"]) + 2.5) ** 2 + hp["dropout"] + 0.1 * hp["layers"] + 4.0 / length


class Driver:
    """Runs the searcher's trials: one report (or early exit) per step, in a seeded order; counts in flight."""

    def __init__(self, searcher: OptunaSearch, order_seed: int = 0, exit_prob: float = 0.0) -> None:
        self.searcher, self.order, self.exit_prob = searcher, random.Random(order_seed), exit_prob
        self.pending: dict[int, TrialRequest] = {}
        self.created: list[TrialRequest] = []
        self.most_in_flight = 0

    def add(self, requests: list[TrialRequest]) -> None:
        for request in requests:
            self.pending[request.request_id] = request
            self.created.append(request)
        running = optuna.trial.TrialState.RUNNING
        in_flight = len(self.searcher.study.get_trials(deepcopy=False, states=(running,)))
        assert in_flight <= len(self.pending)  # less only for a trial told before its runner was killed
        self.most_in_flight = max(self.most_in_flight, in_flight)

    def step(self) -> None:
        rid = self.order.choice(sorted(self.pending))
        length = self.searcher.next_length(rid)
        assert length is not None
        if self.order.random() < self.exit_prob:
            new = self.searcher.on_trial_exited_early(rid)
            del self.pending[rid]
        else:
            new = self.searcher.on_validation(rid, length, _metric(self.pending[rid].hparams, length))
            if self.searcher.next_length(rid) is None:
                del self.pending[rid]
        self.add(new)

    def run(self, steps: int | None = None) -> Driver:
        if not self.created:
            self.add(self.searcher.initial_trials())
        for _ in range(steps if steps is not None else 10_000):
            if not self.pending:
                break
            self.step()
        return self


def _in_space(hp: dict[str, Any]) -> None:
    assert 1e-4 * (1 - 1e-9) <= hp["lr"] <= 0.1 * (1 + 1e-9)
    assert isinstance(hp["layers"], int) and 1 <= hp["layers"] <= 4
    assert 0.0 <= hp["dropout"] <= 0.5
    assert hp["tag"] == {"k": [1]} and hp["plain"] == 3
    if "opt" in hp:
        assert hp["opt"]["name"] in ("adam", "sgd") and hp["opt"]["sizes"] in ([8, 8], [16])


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_hparam_type_through_every_sampler(sampler: str) -> None:
    if sampler == "cmaes":
        with pytest.raises(ConfigError, match=r"hyperparameters\.opt\.name: the optuna sampler cmaes cannot search "
                                              r"categorical hyperparameter 'opt\.name'; use sampler tpe, gp, qmc or "
                                              r"random"):
            _optuna(sampler="cmaes")
        if importlib.util.find_spec("cmaes") is None:
            with pytest.raises(ConfigError, match="sampler cmaes needs the cmaes package"):
                _optuna(NUMERIC, sampler="cmaes")
            return
    searcher = _optuna(SPACE if sampler != "cmaes" else NUMERIC, sampler=sampler, max_trials=12)
    driver = Driver(searcher).run()
    assert len(driver.created) == 12 and searcher.is_done()
    for request in driver.created:
        _in_space(request.hparams)
    trials = searcher.study.get_trials(deepcopy=False)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 12
    lrs = {round(t.params["lr"], 12) for t in trials}
    assert len(lrs) == 12  # suggestions differ (no sampler stuck on one point)
    assert "opt.name" in trials[0].distributions or sampler == "cmaes"


def test_ask_and_tell_counts_equal_the_trials_run_and_never_more_in_flight() -> None:
    searcher = _optuna(max_trials=20, max_concurrent_trials=3, pruner="asha", divisor=2, max_rungs=3)
    driver = Driver(searcher, order_seed=3, exit_prob=0.15).run()
    trials = searcher.study.get_trials(deepcopy=False)
    assert len(driver.created) == len(trials) == 20  # one ask per trial run
    assert driver.most_in_flight == 3
    states = {rid: searcher.trial_state(rid) for rid in range(20)}
    told = {searcher.trial_number(rid): t for rid, t in states.items()}
    expect = {"completed": "COMPLETE", "stopped": "PRUNED", "exited": "FAIL"}
    assert {n: expect[s] for n, s in told.items()} == {t.number: t.state.name for t in trials}
    assert set(states.values()) == {"completed", "stopped", "exited"}


def test_the_runner_caps_the_trials_in_flight_at_what_it_runs() -> None:
    searcher = _optuna(max_concurrent_trials=16)
    searcher.cap_in_flight(2)
    assert len(searcher.initial_trials()) == 2


def _saved(searcher: OptunaSearch) -> dict[str, Any]:
    """The searcher's state as the store keeps it (JSON text and back)."""
    return json.loads(json.dumps(searcher.state_dict(), allow_nan=True))


def _view(study: Any) -> list[tuple[Any, ...]]:
    """What a study holds of each trial (all but its times)."""
    return [(t.number, t.state, t.params, t.distributions, t.values, t.intermediate_values, t.system_attrs)
            for t in study.get_trials(deepcopy=True)]


@pytest.mark.parametrize("sampler", ["tpe", "random", "qmc"])
def test_the_same_seed_gives_the_same_first_8_suggestions(sampler: str) -> None:
    def first_8(seed: int) -> list[dict[str, Any]]:
        return [r.hparams for r in Driver(_optuna(seed=seed, sampler=sampler, max_trials=8)).run().created]

    assert first_8(5) == first_8(5)
    assert first_8(5) != first_8(6)


def test_pruner_asha_stops_trials_at_rungs() -> None:
    searcher = _optuna(max_trials=12, max_concurrent_trials=4, pruner="asha", divisor=2, max_rungs=3)
    assert searcher.rung_lengths == [2, 4, 8]
    Driver(searcher, order_seed=1).run()
    trials = searcher.study.get_trials(deepcopy=False)
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    completed = [t for t in trials if t.state.name == "COMPLETE"]
    assert pruned and completed and len(pruned) + len(completed) == 12
    for t in pruned:  # stopped at a rung: reported there, and nothing beyond it
        assert sorted(t.intermediate_values) in ([2], [2, 4]) and t.value == t.intermediate_values[max(t.intermediate_values)]
    for t in completed:
        assert sorted(t.intermediate_values) == [2, 4]


def test_pruner_median_is_optunas_median_pruner() -> None:
    searcher = _optuna(max_trials=12, pruner="median", divisor=2, max_rungs=2)
    Driver(searcher).run()
    study = searcher.study
    assert isinstance(study.pruner, optuna.pruners.MedianPruner)
    assert {t.state.name for t in study.get_trials(deepcopy=False)} == {"COMPLETE", "PRUNED"}


def test_a_killed_runner_continues_the_same_study() -> None:
    """The runner saves the searcher's state, study included, then asks and tells on; killed, the continued search
    rebuilds the study of the saved state (the later ask and tell are gone with the runner, as its own record of
    them), replays the running trials and ends with max_trials trials, each told once."""
    first = _optuna(max_trials=10, max_concurrent_trials=2, pruner="asha", divisor=2, max_rungs=2)
    driver = Driver(first).run(steps=5)
    saved, at_save = _saved(first), _view(first.study)
    driver.run(steps=1)  # one more report or tell (and maybe an ask), then the runner is killed
    assert _view(first.study) != at_save
    second = _optuna(max_trials=10, max_concurrent_trials=2, pruner="asha", divisor=2, max_rungs=2)
    second.load_state_dict(saved)
    assert _view(second.study) == at_save and len(at_save) < 10
    assert sorted(second.trial_number(rid) for rid in second.running()) == [
        t[0] for t in at_save if t[1].name == "RUNNING"]
    assert _saved(second) == saved  # the rebuilt study records as the saved one
    resumed = Driver(second)
    resumed.pending = {rid: next(r for r in driver.created if r.request_id == rid) for rid in second.running()}
    resumed.run()
    trials = second.study.get_trials(deepcopy=False)
    assert len(trials) == 10 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    assert sorted(second.trial_number(rid) for rid in range(10)) == list(range(10))
    for t in trials:  # the one rung below max_length reported once, also by the trials replayed after the continue
        assert list(t.intermediate_values) == [4]


@pytest.mark.parametrize("sampler", ["tpe", "qmc", "gp", "cmaes"])
def test_a_study_continues_with_the_suggestions_it_would_have_made(sampler: str) -> None:
    """Continued after 9 of 12 trials (past TPE's and GP's 10 random startup trials with the 11th, and past
    CMA-ES's first generation, whose optimizer a trial's system attributes carry), one trial at a time."""
    if sampler == "cmaes" and importlib.util.find_spec("cmaes") is None:
        pytest.skip("cmaes is not installed")
    space = NUMERIC if sampler == "cmaes" else SPACE
    straight = [r.hparams for r in Driver(_optuna(space, max_trials=12, sampler=sampler)).run().created]
    first = _optuna(space, max_trials=12, sampler=sampler)
    before = Driver(first).run(steps=9)  # nine told, the tenth asked
    second = _optuna(space, max_trials=12, sampler=sampler)
    second.load_state_dict(_saved(first))
    after = Driver(second)
    after.pending = {9: before.created[9]}
    after.run()
    assert [r.hparams for r in before.created + after.created] == straight
    if sampler == "cmaes":
        assert any(key.startswith("cma:optimizer") for t in second.study.get_trials(deepcopy=False)[:10]
                   for key in t.system_attrs)


def test_the_record_holds_the_study() -> None:
    """Every trial's state, params, values, intermediate values and sampler attributes come back the same."""
    searcher = _optuna(max_trials=8, max_concurrent_trials=3, pruner="median", divisor=2, max_rungs=2)
    Driver(searcher, order_seed=2, exit_prob=0.2).run(steps=9)
    again = _optuna(max_trials=8, max_concurrent_trials=3, pruner="median", divisor=2, max_rungs=2)
    again.load_state_dict(_saved(searcher))
    assert _view(again.study) == _view(searcher.study)
    assert {t.state.name for t in searcher.study.get_trials(deepcopy=False)} >= {"RUNNING", "FAIL"}


def test_param_importances_need_ten_completed_trials() -> None:
    searcher = _optuna(max_trials=12)
    driver = Driver(searcher).run(steps=9)
    assert param_importances(_saved(searcher)["study"]) is None
    driver.run()
    found = param_importances(_saved(searcher)["study"])
    assert found is not None and set(found) == {"lr", "layers", "dropout", "opt.name", "opt.sizes"}
    assert list(found.values()) == sorted(found.values(), reverse=True)


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="pruner asha stops trials at rungs of max_length"):
        load_config({"searcher": {"name": "optuna", "metric": "loss", "max_trials": 2, "pruner": "asha"}})
    with pytest.raises(ConfigError, match="sampler"):
        load_config({"searcher": {"name": "optuna", "metric": "loss", "max_trials": 2, "sampler": "bohb"}})
    with pytest.raises(ValueError, match=r"\(sampler, pruner, direction\) \('tpe', 'none', 'MINIMIZE'\), the config "
                                         r"asks for \('random'"):
        other = _optuna(sampler="random")
        other.load_state_dict(_optuna().state_dict())


def test_earlier_trials_that_fit_the_space_are_told_before_the_first_ask() -> None:
    search = _optuna()
    fits = {"lr": 0.01, "layers": 2, "dropout": 0.1, "opt": {"name": "sgd", "sizes": [16]}, "tag": {}, "plain": 9}
    misfits = [
        ("trial 2", {**fits, "layers": 7}, "its 'layers' = 7 is outside the range [1, 4]"),
        ("trial 3", {**fits, "opt": {"name": "sgd", "sizes": [32]}}, "its 'opt.sizes' = [32] is outside the choices"),
        ("trial 4", {k: v for k, v in fits.items() if k != "dropout"}, "it has no hyperparameter 'dropout'"),
        ("trial 5", {**fits, "lr": "fast"}, "its 'lr' = 'fast' is outside the range [0.0001, 0.1]"),
    ]
    added, skipped = search.tell_earlier([("trial 1", fits, 0.5)] + [(label, hp, 0.1) for label, hp, _ in misfits])
    assert added == 1 and [why.split(": ", 1)[0] for why in skipped] == [label for label, _, _ in misfits]
    for why, (_, _, expected) in zip(skipped, misfits):
        assert expected in why
    (told,) = search.study.trials  # constants are not compared; the categorical of lists by its index
    assert (told.state.name, told.value, told.params["opt.sizes"], told.params["opt.name"]) == ("COMPLETE", 0.5, 1, "sgd")
    first = search.initial_trials()[0]
    assert search.trial_number(first.request_id) == 1  # the first ask comes after the told trial
    with pytest.raises(RuntimeError, match="before its first suggestion"):
        search.tell_earlier([("trial 6", fits, 0.4)])
