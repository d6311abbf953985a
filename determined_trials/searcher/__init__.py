"""Hyperparameter searchers for local experiments: which trials to create, how long each trains,
which to stop; pure logic with `state_dict()` for pause/continue. `optuna` (``_optuna``, ``_optuna_space``,
``_optuna_study``, ``_optuna_record``) imports optuna only when the config names it; its study lives in memory,
recorded in the searcher's state.

May import: errors, config
"""

from determined_trials.searcher._base import Searcher, TrialRequest, trial_seed
from determined_trials.searcher._explore import explore_hparams
from determined_trials.searcher._optuna import OptunaSearch
from determined_trials.searcher._optuna_record import param_importances, restore_study
from determined_trials.searcher._pbt import PBTSearch
from determined_trials.searcher._rungs import RungSearch, promotes
from determined_trials.searcher._searchers import (
    AdaptiveASHASearch,
    GridSearch,
    RandomSearch,
    SingleSearch,
    asha_rung_lengths,
    make_searcher,
)

__all__ = [
    "AdaptiveASHASearch",
    "GridSearch",
    "PBTSearch",
    "OptunaSearch",
    "RandomSearch",
    "RungSearch",
    "Searcher",
    "SingleSearch",
    "TrialRequest",
    "asha_rung_lengths",
    "explore_hparams",
    "make_searcher",
    "param_importances",
    "promotes",
    "restore_study",
    "trial_seed",
]
