"""`TrialContext`: what every trial context knows (hyperparameters, config, seed, ids, batch
sizes, distributed context), and `from_config` to build one for debugging outside any launcher."""

from __future__ import annotations

import copy
import difflib
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from determined_trials.config import ExperimentConfig, sample_hparams
from determined_trials.config._load import load_raw, validate_raw
from determined_trials.errors import ConfigError

if TYPE_CHECKING:
    from determined_trials.config import ConfigSource
    from determined_trials.core._distributed import DistributedContext

__all__ = ["TrialContext"]

_T = TypeVar("_T", bound="TrialContext")

_DEFAULT_SEARCHER: dict[str, Any] = {
    "name": "single", "metric": "validation_loss", "max_length": {"batches": 100},
}


class TrialContext:
    """A trial's hyperparameters, experiment config, seed and ids; framework contexts extend it."""

    def __init__(
        self,
        *,
        config: ExperimentConfig,
        hparams: Mapping[str, Any],
        trial_seed: int,
        trial_id: int = 0,
        experiment_id: int = 0,
        distributed: DistributedContext | None = None,
    ) -> None:
        if not isinstance(config, ExperimentConfig):
            raise TypeError(
                f"config must be an ExperimentConfig (use determined_trials.config.load_config), "
                f"got {type(config).__name__}"
            )
        self._config = config
        self._hparams = copy.deepcopy(dict(hparams))
        self._trial_seed = int(trial_seed)
        self._trial_id = int(trial_id)
        self._experiment_id = int(experiment_id)
        self._distributed = distributed
        self._load_data_text: dict[tuple[type, str], str] = {}  # checkpoints' load_data.json, made once

    @classmethod
    def from_config(cls: type[_T], config: ConfigSource) -> _T:  # noqa: PYI019
        """Build a context for debugging outside any launcher (e.g. in a REPL or a notebook).

        `config` is anything `load_config` accepts; a config without `searcher` gets a
        `single` searcher (metric `validation_loss`, max_length 100 batches). Hyperparameters
        are sampled with `random.Random(seed)`, seed = `reproducibility.experiment_seed` or 0,
        which is also the trial seed. Trial and experiment ids are 0 (no store record).
        """
        if isinstance(config, ExperimentConfig):
            parsed = config
        else:
            raw, origin = load_raw(config)
            raw.setdefault("searcher", dict(_DEFAULT_SEARCHER))
            parsed = validate_raw(raw, origin)
        seed = parsed.reproducibility.experiment_seed or 0
        hparams = sample_hparams(parsed.hyperparameters, random.Random(seed))
        return cls(config=parsed, hparams=hparams, trial_seed=seed)

    @property
    def config(self) -> ExperimentConfig:
        """The parsed, frozen experiment configuration."""
        return self._config

    @property
    def distributed(self) -> DistributedContext:
        """The trial's DistributedContext (size 1 unless one was given)."""
        if self._distributed is None:
            from determined_trials.core._distributed import DistributedContext

            self._distributed = DistributedContext(
                rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1
            )
        return self._distributed

    def get_hparams(self) -> dict[str, Any]:
        """All hyperparameter values of this trial (a copy)."""
        return copy.deepcopy(self._hparams)

    def get_hparam(self, name: str) -> Any:
        """The value of hyperparameter `name`; KeyError naming the available ones if missing."""
        if name not in self._hparams:
            names = sorted(self._hparams)
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            available = ", ".join(names) if names else "none (the config has no hyperparameters)"
            raise KeyError(
                f"hyperparameter '{name}' is not defined.{hint} Available: {available}. "
                "Add it under `hyperparameters:` in the experiment config."
            )
        return self._hparams[name]

    def get_experiment_config(self) -> dict[str, Any]:
        """The whole experiment config as a plain dict (defaults filled in)."""
        return self._config.as_dict()

    def get_data_config(self) -> dict[str, Any]:
        """The config's free-form `data` section (a copy)."""
        return copy.deepcopy(self._config.data)

    def get_trial_seed(self) -> int:
        """The seed of this trial."""
        return self._trial_seed

    def get_trial_id(self) -> int:
        """The trial id in the local store (0 when not started by a launcher)."""
        return self._trial_id

    def get_experiment_id(self) -> int:
        """The experiment id in the local store (0 when not started by a launcher)."""
        return self._experiment_id

    def get_global_batch_size(self) -> int:
        """Hyperparameter `global_batch_size`: records per optimizer step across all slots."""
        return self._batch_sizes()[0]

    def get_per_slot_batch_size(self) -> int:
        """`global_batch_size` / the number of slots (processes): the batch size each process loads."""
        return self._batch_sizes()[1]

    def _slot_count(self) -> int:
        """The processes training together: the running job's size, else resources.slots_per_trial."""
        if self._distributed is not None and self._distributed.get_size() > 1:
            return int(self._distributed.get_size())
        return int(self._config.resources.slots_per_trial)

    def _batch_sizes(self) -> tuple[int, int]:
        slots = self._slot_count()
        if "global_batch_size" not in self._hparams:
            raise ConfigError(
                "hyperparameter 'global_batch_size' is not set, so the batch sizes are unknown. Fix: "
                "add it under `hyperparameters:`, e.g. `global_batch_size: 64` (it is split across "
                f"the {slots} slot(s) of this trial)."
            )
        total = self._hparams["global_batch_size"]
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise ConfigError(
                f"hyperparameter 'global_batch_size' must be a positive integer, got {total!r}. "
                "Fix: e.g. `global_batch_size: 64` (or an int hyperparameter range)."
            )
        if total < slots:
            raise ConfigError(
                f"global_batch_size ({total}) is smaller than the number of slots ({slots}), so some "
                "slots would get no records (an effective per-slot batch size of 0). "
                f"Fix: use global_batch_size >= {slots} or fewer slots."
            )
        per_slot, rest = divmod(total, slots)
        if rest:
            raise ConfigError(
                f"global_batch_size ({total}) is not divisible by the number of slots ({slots}): "
                f"each slot would get {per_slot} records and the effective global batch size would be "
                f"{per_slot * slots}. Fix: use global_batch_size {per_slot * slots} or "
                f"{(per_slot + 1) * slots}."
            )
        return total, per_slot
