"""Hostile configs are a ConfigError at once (the issue's fuzz cases; each takes well under a second
alone, the timeout only catches a hang): huge grid counts and grids, YAML alias bombs, deep
nesting (YAML and dicts), NaN/inf numbers, log ranges that overflow a float."""

from __future__ import annotations

from typing import Any

import pytest

from determined_trials.config import load_config
from determined_trials.errors import ConfigError

SINGLE = {"name": "single", "metric": "loss", "max_length": 1}
GRID = {"name": "grid", "metric": "loss", "max_length": 1}


def _double(**kw: Any) -> dict[str, Any]:
    return {"type": "double", "minval": 0.0, "maxval": 1.0, **kw}


def _nested(levels: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels):
        node["x"] = {}
        node = node["x"]
    return root


def _alias_bomb(anchors: int = 9, fanout: int = 10) -> str:
    lines = ["a0: &a0 [" + ", ".join(["x"] * fanout) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fanout) + "]" for i in range(1, anchors)]
    return "\n".join([*lines, "searcher: {name: single, metric: loss, max_length: 1}", ""])


CASES: dict[str, tuple[Any, str]] = {
    "grid count 1e9": ({"hyperparameters": {"a": _double(count=10**9)}, "searcher": GRID}, "count"),
    "grid count 1e30": ({"hyperparameters": {"a": _double(count=10**30)}, "searcher": GRID}, "count"),
    "grid of 1e9 points": ({"hyperparameters": {k: _double(count=1000) for k in "abc"}, "searcher": GRID},
                           "the grid has 1e+09 points"),
    "alias bomb": (_alias_bomb(), "alias"),
    "yaml nested 1000 flow": ("data: " + "[" * 1000 + "]" * 1000 + "\nsearcher: {name: single}\n", "nesting"),
    "yaml nested 1000 block": ("data:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(1000)), "nesting"),
    "yaml nested 300": ("data:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(300)), "nesting"),
    "dict nested 1000": ({"data": _nested(1000), "searcher": SINGLE}, "nesting"),
    "dict nested 300": ({"data": _nested(300), "searcher": SINGLE}, "nesting"),
    "lr: nan": ("hyperparameters: {lr: .nan}\nsearcher: {name: single, metric: loss, max_length: 1}\n", "nan"),
    "lr: inf": ({"hyperparameters": {"lr": float("inf")}, "searcher": SINGLE}, "nan or inf"),
    "minval nan": ({"hyperparameters": {"a": _double(minval=float("nan"))}, "searcher": SINGLE}, "finite"),
    "maxval inf": ({"hyperparameters": {"a": _double(maxval=float("inf"))}, "searcher": SINGLE}, "finite"),
    "base nan": ({"hyperparameters": {"a": {"type": "log", "base": float("nan"), "minval": -3, "maxval": -1}},
                  "searcher": SINGLE}, "finite"),
    "base inf": ({"hyperparameters": {"a": {"type": "log", "base": float("inf"), "minval": -3, "maxval": -1}},
                  "searcher": SINGLE}, "finite"),
    "log maxval 1000": ({"hyperparameters": {"a": {"type": "log", "minval": 0, "maxval": 1000}},
                         "searcher": SINGLE}, "out of a float's range"),
    "log minval -1000": ({"hyperparameters": {"a": {"type": "log", "minval": -1000, "maxval": 0}},
                          "searcher": SINGLE}, "out of a float's range"),
    "asha divisor inf": ({"searcher": {"name": "adaptive_asha", "metric": "loss", "max_length": 8,
                                       "max_trials": 4, "divisor": float("inf")}}, "finite"),
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("name", list(CASES))
def test_hostile_config_is_a_config_error(name: str) -> None:
    source, words = CASES[name]
    with pytest.raises(ConfigError) as raised:
        load_config(source)
    assert words in str(raised.value)


def test_sane_configs_still_load() -> None:
    big_grid = {"hyperparameters": {"a": _double(count=100), "b": _double(count=100), "c": {"type": "log",
                "minval": -300, "maxval": 300, "count": 10}}, "searcher": GRID}
    assert load_config(big_grid).hyperparameters["a"].count == 100
    assert load_config({"data": _nested(30), "searcher": SINGLE}).data["x"]["x"] == _nested(28)
    aliased = "data: &b {lr: 0.1}\nhyperparameters: *b\nsearcher: {name: single, metric: l, max_length: 1}"
    assert load_config(aliased).hyperparameters == {"lr": 0.1}  # an alias or two is fine
