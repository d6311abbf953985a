"""`TrialContext`: what every trial context knows (hyperparameters, config, seed, ids, batch
sizes, distributed context, stop requests, the initial batch, the TensorBoard folder), `from_config`
to build one for debugging outside any launcher, and the constructor preamble every family's context
shares (`TrialIdentity`, `_init_identity`).

May import: errors, config, core
"""

from __future__ import annotations

import copy
import difflib
import logging
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from determined_trials.config import (
    ExperimentConfig,
    default_searcher,
    load_config,
    load_raw,
    sample_hparams,
    validate_raw,
)
from determined_trials.errors import ConfigError

if TYPE_CHECKING:
    from determined_trials.config import ConfigSource
    from determined_trials.core import Context, DistributedContext

__all__ = ["TrialContext", "TrialIdentity"]

_T = TypeVar("_T", bound="TrialContext")
logger = logging.getLogger("determined_trials")

_PYTORCH = "det.pytorch.PyTorchTrialContext"
_DEEPSPEED = "det.pytorch.deepspeed.DeepSpeedTrialContext"
_KERAS = "det.keras.TFKerasTrialContext"
_TORCH_BASED = (_PYTORCH, _DEEPSPEED)
# What only a trial family's context has: asked of another context, the error names the one to build.
_FAMILY_ONLY: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("wrap_model", "wrap_optimizer"), (_PYTORCH, _KERAS)),
    **dict.fromkeys(("wrap_lr_scheduler", "wrap_scaler", "backward", "step_optimizer", "autocast"), (_PYTORCH,)),
    **dict.fromkeys(("device", "to_device", "wrap_reducer", "get_enable_tensorboard_logging",
                     "set_enable_tensorboard_logging", "get_tensorboard_writer", "set_profiler",
                     "current_train_batch", "reduce_metrics", "reset_reducers", "run_cross_slot_reduction"),
                    _TORCH_BASED),
    **dict.fromkeys(("wrap_model_engine", "set_mpu", "mpu", "use_pipeline_parallel",
                     "disable_auto_grad_accumulation", "disable_dataset_reproducibility_checks",
                     "get_train_micro_batch_size_per_gpu", "get_num_micro_batches_per_slot"), (_DEEPSPEED,)),
    **dict.fromkeys(("wrap_dataset", "configure_fit"), (_KERAS,)),
}


class TrialIdentity(TypedDict, total=False):
    """The keyword arguments every family's context takes besides ``core_context``: each one given wins over
    the Core API context's trial, and without either the defaults of a lone debugging trial apply."""

    config: ExperimentConfig | Mapping[str, Any] | None
    hparams: Mapping[str, Any] | None
    trial_seed: int | None
    trial_id: int | None
    experiment_id: int | None


class TrialContext:
    """A trial's hyperparameters, experiment config, seed and ids; framework contexts extend it."""

    _core: Context | None = None
    """The Core API context of a running trial (None for a debugging context from ``from_config``)."""

    _searcher_metric_named: bool = True
    """False when the searcher was filled in for the user (by a family's ``init()``, or by ``core.init()``
    without a config or a launcher): its metric is then not enforced."""

    _takes_mesh: bool = False
    """Whether the family reads ``resources.mesh`` (PyTorchTrial); any other refuses a config that sets it."""

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
        ids = {"trial_seed": int(trial_seed), "trial_id": int(trial_id), "experiment_id": int(experiment_id)}
        self._init_fields(config, hparams, distributed, ids)

    def _init_fields(self, config: ExperimentConfig, hparams: Mapping[str, Any], distributed: DistributedContext | None,
                     ids: dict[str, int]) -> None:
        if not isinstance(config, ExperimentConfig):
            raise TypeError(
                f"config must be an ExperimentConfig (use determined_trials.config.load_config), "
                f"got {type(config).__name__}"
            )
        self._config = config
        self._hparams = copy.deepcopy(dict(hparams))
        self._given_ids = MappingProxyType(ids)  # the ids given; the others are the Core API context's trial's
        self._distributed = distributed
        self._load_data_text: dict[tuple[type, str], str] = {}  # checkpoints' load_data.json, made once
        self._stop_requested = False  # read by the adapters after every batch
        self._initial_batch = 0
        self._tb_fallback: Path | None = None

    def _init_identity(self, core_context: Context | None, identity: TrialIdentity) -> None:
        """The constructor preamble of every family's context: ``TrialContext``'s fields from ``identity``,
        else from ``core_context``'s trial, else defaults (seed and ids 0). The ids and seed not given are
        read from the Core API context's trial when asked for (which settles it: see ``core.Context``);
        the hyperparameters, config and initial batch are the same for any trial it may settle as."""
        unknown = sorted(set(identity) - set(TrialIdentity.__annotations__))
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword argument(s): {', '.join(unknown)}")
        trial = core_context.peek_trial() if core_context is not None else None
        hparams = identity.get("hparams")
        given = {"trial_seed": identity.get("trial_seed"), "trial_id": identity.get("trial_id"),
                 "experiment_id": identity.get("experiment_id")}
        self._init_fields(
            _resolve_config(type(self).__name__, identity.get("config"), trial and trial.config),
            hparams if hparams is not None else (trial.hparams if trial else {}),
            core_context.distributed if core_context is not None else None,
            {name: int(value) for name, value in given.items() if value is not None},
        )
        self._core = core_context
        if self._config.resources.mesh is not None and not self._takes_mesh:
            raise ConfigError(
                f"resources.mesh is set, but a {type(self).__name__} has no device mesh: the mesh is for a "
                "PyTorchTrial (FSDP2, HSDP, tensor parallel). Fix: remove resources.mesh (DeepSpeed's layout is "
                "its own config's; Keras's is its strategy)"
            )
        self._initial_batch = trial.steps_completed if trial is not None else 0
        if identity.get("config") is None and core_context is not None and not core_context._config_written:
            self._searcher_metric_named = False  # core.init() made the config up: its searcher is not the user's

    def _trial_field(self, name: str) -> int:
        """An id or the seed: as given, else the Core API context's trial's (settled once), else 0."""
        given = self._given_ids.get(name)
        if given is not None:
            return given
        if self._core is None:
            return 0
        return int(getattr(self._core.info.trial, name))

    @property
    def _trial_seed(self) -> int:
        """The trial's seed (read-only: a context's trial does not change)."""
        return self._trial_field("trial_seed")

    @property
    def _trial_id(self) -> int:
        """The trial's id (read-only)."""
        return self._trial_field("trial_id")

    @property
    def _experiment_id(self) -> int:
        """The trial's experiment's id (read-only)."""
        return self._trial_field("experiment_id")

    if not TYPE_CHECKING:  # for mypy, attributes stay checked

        def __getattr__(self, name: str) -> Any:
            """Only reached for a missing attribute: a family's method (``wrap_model``...) names the
            family context to build instead."""
            families = _FAMILY_ONLY.get(name)
            if families is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            calls = " or ".join(f"`{family}.from_config(config)`" for family in families)
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}: {name} belongs to a trial family's "
                f"context; build one with {calls} (a bare det.TrialContext knows only hyperparameters, config, "
                "ids and batch sizes)"
            )

    @classmethod
    def from_config(cls: type[_T], config: ConfigSource) -> _T:  # noqa: PYI019
        """Build a context for debugging outside any launcher (e.g. in a REPL or a notebook); for a
        trial class, call it on the trial family's context (``det.pytorch.PyTorchTrialContext``,
        ``det.pytorch.deepspeed.DeepSpeedTrialContext``, ``det.keras.TFKerasTrialContext``), which has
        ``wrap_model`` and the rest; this base one has hyperparameters, config, ids and batch sizes.

        `config` is anything `load_config` accepts; a config without `searcher` gets a
        `single` searcher (metric `validation_loss`, max_length 100 batches). Hyperparameters
        are sampled with `random.Random(seed)`, seed = `reproducibility.experiment_seed` or 0,
        which is also the trial seed. Trial and experiment ids are 0 (no store record).
        """
        if isinstance(config, ExperimentConfig):
            parsed = config
        else:
            raw, origin = load_raw(config)
            raw.setdefault("searcher", default_searcher())
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
            from determined_trials.core import DistributedContext

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

    def set_stop_requested(self, stop_requested: bool) -> None:
        """Ask the trainer to stop (with a checkpoint) at the end of the current batch."""
        if not isinstance(stop_requested, bool):
            raise TypeError(f"set_stop_requested takes True or False, got {stop_requested!r}")
        self._stop_requested = stop_requested

    def get_stop_requested(self) -> bool:
        """Whether a stop was requested (``set_stop_requested(True)``; in Keras also ``model.stop_training``)."""
        return self._stop_requested

    def get_initial_batch(self) -> int:
        """The number of batches trained before this run started (non-zero when resuming)."""
        return self._initial_batch

    def get_tensorboard_path(self) -> Path:
        """The folder for this process's TensorBoard files (a temporary folder without a Core API context)."""
        if self._core is not None:
            return Path(self._core.train.get_tensorboard_path())
        if self._tb_fallback is None:
            self._tb_fallback = Path(tempfile.mkdtemp(prefix="det-trials-tensorboard-"))
            logger.info("no Core API context: TensorBoard files go to %s", self._tb_fallback)
        return self._tb_fallback

    def get_global_batch_size(self) -> int:
        """Hyperparameter `global_batch_size`: records per optimizer step across all slots."""
        return self._batch_sizes()[0]

    def get_per_slot_batch_size(self) -> int:
        """`global_batch_size` / the number of slots (processes): the batch size each process loads."""
        return self._batch_sizes()[1]

    def _slot_count(self) -> int:
        """The data-parallel processes (each loads its own part of a batch): the running job's size, else
        resources.slots_per_trial, divided by the mesh's tensor-parallel size (its ranks share a batch)."""
        mesh = self._config.resources.mesh
        tp = mesh.tp if mesh is not None else 1
        if self._distributed is not None and self._distributed.get_size() > 1:
            return int(self._distributed.get_size()) // tp
        return int(self._config.resources.slots_per_trial) // tp

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


def _resolve_config(owner: str, config: Any, trial_config: Any) -> ExperimentConfig:
    for candidate in (config, trial_config):
        if isinstance(candidate, ExperimentConfig):
            return candidate
        if candidate is not None:
            return load_config(dict(candidate))
    raise TypeError(f"{owner} needs `config` (an ExperimentConfig or dict) or a `core_context`")
