"""A searcher whose rungs collapse to one (``pruner: asha``/``median`` or adaptive_asha with a length shorter
than the divisor, or ``max_rungs: 1``) stops no trial early: the config says so with a ``ConfigWarning``."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from determined_trials.config import ConfigWarning, load_config

_OPTUNA = {"name": "optuna", "metric": "loss", "max_trials": 4, "pruner": "asha"}
_ASHA = {"name": "adaptive_asha", "metric": "loss", "max_trials": 4}


@pytest.mark.parametrize("searcher", [
    {**_OPTUNA, "max_length": {"epochs": 3}},  # 3 < divisor 4: one rung
    {**_OPTUNA, "pruner": "median", "max_length": {"batches": 100}, "max_rungs": 1},
    {**_ASHA, "max_length": {"batches": 6}, "divisor": 8},
    {**_ASHA, "time_metric": "batches", "max_time": 3},
], ids=["asha-short", "median-one-rung", "adaptive-asha-short", "adaptive-asha-time"])
def test_a_single_rung_warns(searcher: dict[str, Any]) -> None:
    with pytest.warns(ConfigWarning, match="has a single rung .* so no trial is stopped early"):
        load_config({"searcher": searcher})


@pytest.mark.parametrize("searcher", [
    {**_OPTUNA, "max_length": {"epochs": 4}},  # rungs 1 and 4
    {**_OPTUNA, "pruner": "none", "max_length": {"epochs": 1}},  # no pruner: no rungs to speak of
    {**_ASHA, "max_length": {"batches": 100}},
], ids=["asha-two-rungs", "no-pruner", "adaptive-asha"])
def test_rungs_that_prune_do_not_warn(searcher: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        load_config({"searcher": searcher})
