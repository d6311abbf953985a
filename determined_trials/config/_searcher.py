"""The `searcher` section: one model per searcher, chosen by `name`."""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import Field, model_validator

from determined_trials.config._base import ConfigProblems, StrictModel, tagged_union
from determined_trials.config._det_keys import ConfigWarning, drop_unused_keys, warn_config
from determined_trials.config._hparams import CategoricalHP, hparam_leaves
from determined_trials.config._length import Length, MaxLength

__all__ = [
    "AdaptiveASHASearcher",
    "GridSearcher",
    "OptunaSearcher",
    "OptunaWarmStart",
    "PBTExplore",
    "PBTReplace",
    "PBTSearcher",
    "RandomSearcher",
    "SearcherConfig",
    "SingleSearcher",
    "default_searcher",
    "optuna_sampler_problems",
]


def default_searcher() -> dict[str, Any]:
    """The searcher section of a run whose config names none (a plain script, ``from_config``): the schema
    needs one; its metric is enforced only where the user wrote it."""
    return {"name": "single", "metric": "validation_loss", "max_length": {"batches": 100}}


def _max_concurrent() -> Any:
    return Field(
        default=16, ge=0,
        description="the most trials running at once. Locally, trials run one at a time unless this key, "
                    "`--max-parallel` or `resources.max_slots` asks for more (16 CPU trials at once would "
                    "swamp one machine); set, it runs that many, at most what the GPUs (else CPU cores) hold "
                    "(0 = as many as they hold). On Ray (`--ray`) the default 16 applies. E.g. "
                    "`max_concurrent_trials: 4`",
    )


def _max_trials() -> Any:
    return Field(ge=1, description="how many trials to run, e.g. `max_trials: 16`")


class _SearcherBase(StrictModel):
    """Keys every searcher shares."""

    name: str = Field(description="the searcher: single, grid, random, adaptive_asha or optuna")
    metric: str = Field(
        min_length=1,
        description="the validation metric the searcher optimises, e.g. `metric: validation_loss`",
    )
    smaller_is_better: bool = Field(
        default=True, description="whether a smaller metric is better, e.g. `smaller_is_better: false`"
    )
    max_length: MaxLength | None = Field(
        default=None, description="how long each trial trains, e.g. `max_length: {batches: 1000}` or `1000`"
    )
    source_trial_id: int | None = Field(
        default=None, ge=1,
        description="a warm start: every trial starts from the model weights of this trial's latest checkpoint "
        "(a trial of the same run folder), its counters and data position from 0, e.g. `source_trial_id: 3`",
    )
    source_checkpoint_uuid: str | None = Field(
        default=None, min_length=1,
        description="a warm start from this checkpoint's model weights (as source_trial_id), e.g. "
        "`source_checkpoint_uuid: 0f1e...`; with both keys, source_trial_id wins (as in Determined)",
    )

    @model_validator(mode="before")
    @classmethod
    def _cluster_only(cls, data: Any) -> Any:
        name = data.get("name") if isinstance(data, dict) else None
        return drop_unused_keys(data, f"searcher.{name}", cls.model_fields, "searcher ")

    @model_validator(mode="after")
    def _check_source(self) -> _SearcherBase:
        if self.source_trial_id is not None and self.source_checkpoint_uuid is not None:
            warn_config(f"experiment config: searcher.source_checkpoint_uuid {self.source_checkpoint_uuid!r} is "
                        f"ignored: source_trial_id {self.source_trial_id} is given too and wins (as in Determined)")
        return self

    def concurrency_cap(self) -> int | None:
        """Its ``max_concurrent_trials`` (0: as many as fit), or None for a searcher without the key (single, pbt)."""
        return self.max_concurrent_trials if isinstance(self, _CAPPED) else None


class SingleSearcher(_SearcherBase):
    """One trial with the hyperparameters as sampled."""

    name: Literal["single"] = "single"


class RandomSearcher(_SearcherBase):
    """`max_trials` trials with independently sampled hyperparameters."""

    name: Literal["random"] = "random"
    max_trials: int = _max_trials()
    max_concurrent_trials: int = _max_concurrent()


class GridSearcher(_SearcherBase):
    """One trial per point of the hyperparameter grid (int/double/log need `count`)."""

    name: Literal["grid"] = "grid"
    max_concurrent_trials: int = _max_concurrent()


class AdaptiveASHASearcher(_SearcherBase):
    """Asynchronous successive halving over `max_trials` sampled trials."""

    name: Literal["adaptive_asha"] = "adaptive_asha"
    max_trials: int = _max_trials()
    max_concurrent_trials: int = _max_concurrent()
    divisor: float = Field(
        default=4.0, gt=1, allow_inf_nan=False, description="1/divisor of a rung is promoted, e.g. `divisor: 4`")
    max_rungs: int = Field(default=5, ge=1, description="the most rungs of a bracket, e.g. `max_rungs: 5`")
    mode: Literal["aggressive", "standard", "conservative"] = Field(
        default="standard", description="how many brackets to run, e.g. `mode: standard`"
    )
    time_metric: str | None = Field(
        default=None, min_length=1, description="a reported metric measuring progress instead of max_length"
    )
    max_time: int | None = Field(
        default=None, ge=1, description="the time_metric value a trial trains to, e.g. `max_time: 1000`"
    )
    stop_once: bool | None = Field(
        default=None,
        description="Determined's ASHA that decides each trial once at its rung (promoted now or stopped for "
        "good): this ASHA always works so; `false` (later promotions) is accepted with a warning",
    )

    @model_validator(mode="after")
    def _check_stop_once(self) -> AdaptiveASHASearcher:
        if self.stop_once is False:
            warnings.warn(
                "experiment config: searcher.stop_once: false asks for later promotions of stopped trials; this "
                "adaptive_asha decides each trial once, at its rung (as stop_once: true), so a stopped trial "
                "is never promoted later",
                ConfigWarning,
                stacklevel=2,
            )
        return self

    @model_validator(mode="after")
    def _check_length(self) -> AdaptiveASHASearcher:
        if (self.time_metric is None) != (self.max_time is None):
            missing = "max_time" if self.max_time is None else "time_metric"
            raise ConfigProblems.at(
                (missing,), "time_metric and max_time go together; set both, or neither and use max_length"
            )
        if self.max_length is None and self.time_metric is None:
            raise ConfigProblems.at(
                ("max_length",), "adaptive_asha needs a length: set e.g. `max_length: {batches: 1000}` "
                "(or time_metric with max_time)"
            )
        length = self.max_length.value if self.max_length is not None else self.max_time
        _warn_single_rung("adaptive_asha", int(length or 0), self.divisor, self.max_rungs)
        return self


class PBTReplace(StrictModel):
    """`replace_function`: how many of the population a round replaces."""

    truncate_fraction: float = Field(
        ge=0.0, le=1.0, allow_inf_nan=False,
        description="the worst fraction of the population replaced each round by children of the best "
        "(floor(truncate_fraction * population_size) trials), e.g. `truncate_fraction: 0.2`",
    )


class PBTExplore(StrictModel):
    """`explore_function`: how a child's hyperparameters move away from its parent's."""

    resample_probability: float = Field(
        ge=0.0, le=1.0, allow_inf_nan=False,
        description="the chance that a child's hyperparameter is drawn afresh from its range; otherwise a "
        "number is multiplied by 1 - perturb_factor or 1 + perturb_factor, e.g. `resample_probability: 0.2`",
    )
    perturb_factor: float = Field(
        ge=0.0, le=1.0, allow_inf_nan=False,
        description="how far a kept number moves: times (1 ± perturb_factor), within its range, e.g. "
        "`perturb_factor: 0.2`",
    )


class PBTSearcher(_SearcherBase):
    """Population-based training, in Determined's `searcher-pbt` schema: `population_size` trials train
    `length_per_round`; each round the worst `truncate_fraction` is replaced by children of the best, which
    continue from their parent's checkpoint with explored hyperparameters, for `num_rounds` rounds.
    `max_length` is `num_rounds` × `length_per_round` (set for you)."""

    name: Literal["pbt"] = "pbt"
    population_size: int = Field(ge=1, description="how many trials train in every round, e.g. `population_size: 8`")
    num_rounds: int = Field(ge=1, description="how many rounds of training, e.g. `num_rounds: 4`")
    length_per_round: MaxLength = Field(
        description="how long each trial trains per round, e.g. `length_per_round: {batches: 600}`"
    )
    replace_function: PBTReplace = Field(
        description="`truncate_fraction` (0 to 1): the worst floor(truncate_fraction x population_size) trials "
        "are replaced each round by children of as many best, e.g. `replace_function: {truncate_fraction: 0.2}`"
    )
    explore_function: PBTExplore = Field(
        description="a child's hyperparameters: each resampled with `resample_probability` (0 to 1), else a "
        "number times 1 - or 1 + `perturb_factor` (0 to 1), kept in its range, e.g. "
        "`explore_function: {resample_probability: 0.2, perturb_factor: 0.2}`"
    )

    @model_validator(mode="after")
    def _check_max_length(self) -> PBTSearcher:
        per_round = self.length_per_round
        full = Length(per_round.value * self.num_rounds, per_round.unit)
        if self.max_length is None:
            object.__setattr__(self, "max_length", full)  # frozen: set once, while validating
        elif self.max_length != full:
            raise ConfigProblems.at(
                ("max_length",), f"pbt trains num_rounds x length_per_round = {full}; max_length says "
                f"{self.max_length}: drop max_length (it is set for you)"
            )
        return self


OptunaSampler = Literal["tpe", "gp", "cmaes", "qmc", "random"]
_CATEGORICAL_SAMPLERS = ("tpe", "gp", "qmc", "random")


class OptunaWarmStart(StrictModel):
    """`warm_start`: earlier experiments whose finished trials the new study is told before its first
    suggestion."""

    experiments: list[int] = Field(
        min_length=1,
        description="ids of earlier experiments in the same run folder; their completed trials whose "
        "hyperparameters fit this search space are added to the study with their searcher metric, e.g. "
        "`experiments: [3, 4]`",
    )


class OptunaSearcher(_SearcherBase):
    """Optuna's samplers (ask and tell) over `max_trials` trials; `pip install determined-trials[optuna]`."""

    name: Literal["optuna"] = "optuna"
    max_trials: int = _max_trials()
    max_concurrent_trials: int = _max_concurrent()
    sampler: OptunaSampler = Field(
        default="tpe", description="Optuna's sampler: tpe (TPE with constant_liar for running trials), gp "
        "(Gaussian process), cmaes (CMA-ES; no categorical hyperparameters), qmc (quasi-Monte Carlo) or random, "
        "e.g. `sampler: tpe`")
    pruner: Literal["none", "asha", "median"] = Field(
        default="none", description="stopping trials early at rungs (lengths max_length / divisor**k): none, asha "
        "(adaptive_asha's promotion rule) or median (Optuna's MedianPruner), e.g. `pruner: asha`")
    divisor: float = Field(
        default=4.0, gt=1, allow_inf_nan=False,
        description="with a pruner: the ratio of successive rung lengths (asha: 1/divisor of a rung is promoted), "
        "e.g. `divisor: 4`")
    max_rungs: int = Field(default=5, ge=1, description="with a pruner: the most rungs, e.g. `max_rungs: 5`")
    warm_start: OptunaWarmStart | None = Field(
        default=None, description="start the study informed by earlier experiments' trials, e.g. "
        "`warm_start: {experiments: [3]}` (docs/search.md)")

    @model_validator(mode="after")
    def _check_length(self) -> OptunaSearcher:
        if self.pruner != "none" and self.max_length is None:
            raise ConfigProblems.at(
                ("max_length",), f"pruner {self.pruner} stops trials at rungs of max_length; set e.g. "
                "`max_length: {batches: 1000}`, or use `pruner: none`")
        if self.pruner != "none" and self.max_length is not None:
            _warn_single_rung(f"pruner: {self.pruner}", self.max_length.value, self.divisor, self.max_rungs)
        return self


def _warn_single_rung(what: str, length: int, divisor: float, max_rungs: int) -> None:
    """Warn when rungs of ``length / divisor**k`` (at least 1) leave one rung: nothing would be stopped early."""
    if max_rungs == 1 or length < divisor:
        warnings.warn(
            f"experiment config: searcher {what} with a length of {length}, divisor {divisor:g} and max_rungs "
            f"{max_rungs} has a single rung (rungs are length / divisor**k, at least 1), so no trial is stopped "
            "early; raise max_length (or max_time) or max_rungs, or lower divisor",
            ConfigWarning, stacklevel=3,
        )


def optuna_sampler_problems(space: Any, searcher: OptunaSearcher) -> list[tuple[tuple[str, ...], str]]:
    """The hyperparameters `searcher.sampler` cannot take (categoricals of two or more values for cmaes,
    which Optuna would draw at random on the side), as (location, message)."""
    if searcher.sampler in _CATEGORICAL_SAMPLERS:
        return []
    problems: list[tuple[tuple[str, ...], str]] = []
    for route, spec in hparam_leaves(space):
        if isinstance(spec, CategoricalHP) and len(spec.vals) > 1:
            problems.append((route, (
                f"the optuna sampler {searcher.sampler} cannot search categorical hyperparameter "
                f"'{'.'.join(route)}'; use sampler {', '.join(_CATEGORICAL_SAMPLERS[:-1])} or "
                f"{_CATEGORICAL_SAMPLERS[-1]}, or make it an int/double range")))
    return problems


_CAPPED = (RandomSearcher, GridSearcher, AdaptiveASHASearcher, OptunaSearcher)  # those with max_concurrent_trials

SearcherConfig = tagged_union(
    {
        "single": SingleSearcher, "grid": GridSearcher, "random": RandomSearcher,
        "adaptive_asha": AdaptiveASHASearcher, "optuna": OptunaSearcher, "pbt": PBTSearcher,
    },
    key="name",
    what="a mapping with `name:` and `metric:`",
)
"""`searcher`: a discriminated union on `name`."""
