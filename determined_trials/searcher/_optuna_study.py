"""Optuna itself, imported lazily: the experiment's study (in memory), the samplers and pruners by their config
names."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from determined_trials.errors import ConfigError

__all__ = ["STUDY_NAME", "import_optuna", "make_sampler", "open_study", "quiet"]

STUDY_NAME = "det-trials"


def import_optuna() -> ModuleType:
    """`optuna`, with its logging lowered to warnings; a clear error naming the extra when it is missing."""
    try:
        import optuna
    except ImportError as exc:
        raise ConfigError(f"searcher `name: optuna` needs the optuna package ({exc}); install it with "
                          "`pip install determined-trials[optuna]`") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Optuna's warnings about experimental arguments and its own choices, which the user cannot act on."""
    optuna = import_optuna()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", UserWarning)
        yield


def make_sampler(name: str, *, seed: int, experiment_seed: int) -> Any:
    """The sampler `name` for one suggestion, seeded by `seed` (QMC by `experiment_seed`: its sequence runs
    across suggestions, its position kept in the study)."""
    optuna = import_optuna()
    samplers = optuna.samplers
    with quiet():
        if name == "tpe":
            return samplers.TPESampler(seed=seed, constant_liar=True)
        if name == "random":
            return samplers.RandomSampler(seed=seed)
        if name == "qmc":
            return samplers.QMCSampler(seed=experiment_seed, warn_independent_sampling=False)
        if name == "gp":
            return samplers.GPSampler(seed=seed, warn_independent_sampling=False)
        if name == "cmaes":
            try:
                import cmaes  # noqa: F401
            except ImportError:
                raise ConfigError("optuna's sampler cmaes needs the cmaes package; install it with "
                                  "`pip install cmaes` (or pick sampler tpe, gp, qmc or random)") from None
            return samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    raise ConfigError(f"unknown optuna sampler {name!r}; use tpe, gp, cmaes, qmc or random")


def open_study(
    *, smaller_is_better: bool, median_pruner: bool, sampler: Any, system_attrs: dict[str, Any] | None = None,
) -> Any:
    """A new study in Optuna's in-memory storage, with the study-level `system_attrs` a sampler kept (QMC's
    position in its sequence) when it is rebuilt from a record (`_optuna_record`)."""
    optuna = import_optuna()
    storage = optuna.storages.InMemoryStorage()
    direction = optuna.study.StudyDirection.MINIMIZE if smaller_is_better else optuna.study.StudyDirection.MAXIMIZE
    study_id = storage.create_new_study([direction], STUDY_NAME)
    for key, value in (system_attrs or {}).items():
        storage.set_study_system_attr(study_id, key, value)
    pruner = optuna.pruners.MedianPruner() if median_pruner else optuna.pruners.NopPruner()
    with quiet():
        return optuna.load_study(study_name=STUDY_NAME, storage=storage, sampler=sampler, pruner=pruner)
