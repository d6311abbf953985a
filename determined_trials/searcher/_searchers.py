"""The four searchers (single, grid, random, adaptive_asha) and `make_searcher` for a config (which builds
`optuna`'s from `_optuna`, imported only then)."""

from __future__ import annotations

import random
import secrets
from collections.abc import Mapping
from typing import Any, Literal

from determined_trials.config import (
    AdaptiveASHASearcher,
    ExperimentConfig,
    GridSearcher,
    OptunaSearcher,
    PBTSearcher,
    RandomSearcher,
    SingleSearcher,
    grid_points,
    sample_hparams,
)
from determined_trials.errors import ConfigError
from determined_trials.searcher._base import Searcher
from determined_trials.searcher._pbt import PBTSearch
from determined_trials.searcher._rungs import RungSearch

__all__ = [
    "AdaptiveASHASearch",
    "GridSearch",
    "RandomSearch",
    "SingleSearch",
    "asha_rung_lengths",
    "make_searcher",
]


class RandomSearch(RungSearch):
    """`max_trials` trials, each trained to `max_length`; trial i gets the (i+1)-th draw of
    `sample_hparams(space, random.Random(experiment_seed))`."""

    kind = "random"

    def __init__(
        self, space: Mapping[str, Any], *, max_length: int, max_trials: int, experiment_seed: int,
        max_concurrent: int = 0, rung_lengths: list[int] | None = None, divisor: float = 4.0,
        smaller_is_better: bool = True,
    ) -> None:
        super().__init__(
            rung_lengths=rung_lengths or [max_length], max_trials=max_trials, max_concurrent=max_concurrent,
            experiment_seed=experiment_seed, divisor=divisor, smaller_is_better=smaller_is_better,
        )
        self._space = dict(space)
        self._rng = random.Random(experiment_seed)

    def _hparams_for(self, request_id: int) -> dict[str, Any]:
        return sample_hparams(self._space, self._rng)

    def _extra_state(self) -> dict[str, Any]:
        version, internal, gauss = self._rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))


class SingleSearch(RandomSearch):
    """One trial trained to `max_length`, hparams from `sample_hparams(space, Random(seed))`."""

    kind = "single"

    def __init__(self, space: Mapping[str, Any], *, max_length: int, experiment_seed: int) -> None:
        super().__init__(space, max_length=max_length, max_trials=1, experiment_seed=experiment_seed)


class GridSearch(RungSearch):
    """One trial per `grid_points(space)` point (in that order), each trained to `max_length`."""

    kind = "grid"

    def __init__(
        self, space: Mapping[str, Any], *, max_length: int, experiment_seed: int, max_concurrent: int = 0
    ) -> None:
        self._points = grid_points(space)
        super().__init__(
            rung_lengths=[max_length], max_trials=len(self._points), max_concurrent=max_concurrent,
            experiment_seed=experiment_seed,
        )

    def _hparams_for(self, request_id: int) -> dict[str, Any]:
        return self._points[request_id]


def asha_rung_lengths(max_length: int, divisor: float, max_rungs: int) -> list[int]:
    """Rung r of R has length floor(max_length / divisor**(R-1-r)) (the last is max_length), with
    R = max_rungs lowered until the first rung is >= 1; lengths that coincide are merged."""
    rungs = max_rungs
    while rungs > 1 and max_length / divisor ** (rungs - 1) < 1 - 1e-9:
        rungs -= 1
    lengths = [max(1, int(max_length / divisor ** (rungs - 1 - r) + 1e-9)) for r in range(rungs)]
    lengths[-1] = max_length
    return sorted(set(lengths))


class AdaptiveASHASearch(RandomSearch):
    """Asynchronous successive halving, one bracket: `max_trials` randomly sampled trials start at
    rung 0; a trial reporting at rung r is promoted to r+1 iff its metric is among the best
    max(1, floor(n / divisor)) of the n metrics reported at rung r so far (its own included; ties
    go to the earlier report), else stopped for good: Determined's `stop_once` variant (a stopped trial is
never promoted later). `mode` is accepted but every mode runs one bracket."""

    kind = "adaptive_asha"

    def __init__(
        self, space: Mapping[str, Any], *, max_length: int, max_trials: int, experiment_seed: int,
        max_concurrent: int = 0, divisor: float = 4.0, max_rungs: int = 5, smaller_is_better: bool = True,
        mode: Literal["aggressive", "standard", "conservative"] = "standard",
    ) -> None:
        super().__init__(
            space, max_length=max_length, max_trials=max_trials, experiment_seed=experiment_seed,
            max_concurrent=max_concurrent, rung_lengths=asha_rung_lengths(max_length, divisor, max_rungs),
            divisor=divisor, smaller_is_better=smaller_is_better,
        )
        self.mode = mode


def _resolve_seed(config: ExperimentConfig, experiment_seed: int | None) -> int:
    if experiment_seed is not None:
        return experiment_seed
    if config.reproducibility.experiment_seed is not None:
        return config.reproducibility.experiment_seed
    return secrets.randbelow(2**31 - 1)


def _plain_length(config: ExperimentConfig) -> int:
    max_length = config.searcher.max_length
    return max_length.value if max_length is not None else 1


def make_searcher(config: ExperimentConfig, *, experiment_seed: int | None = None) -> Searcher:
    """The searcher `config.searcher` names. The seed is `experiment_seed`, else
    `reproducibility.experiment_seed`, else a fresh random one (kept in `state_dict()`).
    Without `max_length`, single/grid/random use length 1 and adaptive_asha uses `max_time`."""
    seed = _resolve_seed(config, experiment_seed)
    searcher, space = config.searcher, config.hyperparameters
    if isinstance(searcher, SingleSearcher):
        return SingleSearch(space, max_length=_plain_length(config), experiment_seed=seed)
    if isinstance(searcher, GridSearcher):
        return GridSearch(
            space, max_length=_plain_length(config), experiment_seed=seed,
            max_concurrent=searcher.max_concurrent_trials,
        )
    if isinstance(searcher, RandomSearcher):
        return RandomSearch(
            space, max_length=_plain_length(config), max_trials=searcher.max_trials, experiment_seed=seed,
            max_concurrent=searcher.max_concurrent_trials,
        )
    if isinstance(searcher, AdaptiveASHASearcher):
        length = searcher.max_length.value if searcher.max_length is not None else searcher.max_time
        if length is None:  # the config model already rejects this
            raise ConfigError("adaptive_asha needs searcher.max_length (or time_metric with max_time)")
        return AdaptiveASHASearch(
            space, max_length=length, max_trials=searcher.max_trials, experiment_seed=seed,
            max_concurrent=searcher.max_concurrent_trials, divisor=searcher.divisor,
            max_rungs=searcher.max_rungs, smaller_is_better=searcher.smaller_is_better, mode=searcher.mode,
        )
    if isinstance(searcher, PBTSearcher):
        return _pbt_search(searcher, space, seed)
    if isinstance(searcher, OptunaSearcher):
        from determined_trials.searcher._optuna import OptunaSearch  # optuna only for this searcher

        length = _plain_length(config)
        return OptunaSearch(
            space, max_length=length, max_trials=searcher.max_trials, experiment_seed=seed,
            max_concurrent=searcher.max_concurrent_trials, sampler=searcher.sampler, pruner=searcher.pruner,
            divisor=searcher.divisor, rung_lengths=asha_rung_lengths(length, searcher.divisor, searcher.max_rungs),
            smaller_is_better=searcher.smaller_is_better,
        )
    raise ConfigError(f"unknown searcher {searcher.name!r}; use single, grid, random, adaptive_asha, optuna or pbt")


def _pbt_search(searcher: PBTSearcher, space: Mapping[str, Any], seed: int) -> PBTSearch:
    return PBTSearch(
        dict(space), population_size=searcher.population_size, num_rounds=searcher.num_rounds,
        length_per_round=searcher.length_per_round.value,
        truncate_fraction=searcher.replace_function.truncate_fraction,
        resample_probability=searcher.explore_function.resample_probability,
        perturb_factor=searcher.explore_function.perturb_factor, experiment_seed=seed,
        smaller_is_better=searcher.smaller_is_better,
    )
