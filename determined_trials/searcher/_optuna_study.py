"""Optuna itself, imported lazily: the study's journal file in the experiment folder, the samplers and pruners by
their config names, and the parameter importances the dashboard shows."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from determined_trials.errors import ConfigError

__all__ = ["MIN_TRIALS_FOR_IMPORTANCES", "STUDY_FILE", "STUDY_NAME", "import_optuna", "make_sampler", "open_study",
           "param_importances"]

STUDY_FILE = "optuna_study.journal"  # in the experiment's folder, beside model/ and config.yaml
STUDY_NAME = "det-trials"
MIN_TRIALS_FOR_IMPORTANCES = 10


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


def _file_storage(path: Path) -> Any:
    """Optuna's journal storage on `path`: an append-only log of the study's changes (each append written and
    fsynced under a lock), read back whole when opened. Chosen over RDB storage on SQLite, whose queries cost
    ~300 ms per suggestion at 200 trials against the journal's ~60 ms (docs/search.md)."""
    optuna = import_optuna()
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


def open_study(path: Path | None, *, smaller_is_better: bool, median_pruner: bool, sampler: Any) -> Any:
    """The experiment's study: created or loaded from the journal file `path` (None: in memory)."""
    optuna = import_optuna()
    storage = optuna.storages.InMemoryStorage() if path is None else _file_storage(path)
    pruner = optuna.pruners.MedianPruner() if median_pruner else optuna.pruners.NopPruner()
    with quiet():
        return optuna.create_study(
            storage=storage, study_name=STUDY_NAME, sampler=sampler, pruner=pruner, load_if_exists=True,
            direction="minimize" if smaller_is_better else "maximize",
        )


def param_importances(path: Path) -> dict[str, float] | None:
    """Optuna's `get_param_importances` of the study in `path` (name -> share, largest first), or None
    before `MIN_TRIALS_FOR_IMPORTANCES` trials completed, without a study file or without optuna."""
    if not path.is_file():
        return None
    try:
        optuna = import_optuna()
    except ConfigError:
        return None
    with quiet():
        study = optuna.load_study(study_name=STUDY_NAME, storage=_file_storage(path))
        states = (optuna.trial.TrialState.COMPLETE,)
        if len(study.get_trials(deepcopy=False, states=states)) < MIN_TRIALS_FOR_IMPORTANCES:
            return None
        importances = optuna.importance.get_param_importances(study)
    return {name: float(value) for name, value in importances.items()}
