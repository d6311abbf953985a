"""`ExperimentConfig`, the frozen typed experiment configuration, and its smaller sections."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from determined_trials.config._base import ConfigProblems, StrictModel, json_value
from determined_trials.config._det_keys import ConfigWarning, drop_unused_keys, warn_ignored_settings
from determined_trials.config._hparams import HParams, grid_count_problems
from determined_trials.config._integrations import Integrations
from determined_trials.config._length import Period
from determined_trials.config._searcher import GridSearcher, OptunaSearcher, SearcherConfig, optuna_sampler_problems
from determined_trials.config._storage import StorageConfig

__all__ = [
    "ConfigWarning",
    "ExperimentConfig",
    "Mesh",
    "Optimizations",
    "Profiling",
    "Reproducibility",
    "Resources",
]

_MAX_SEED = 2**31 - 1
_IGNORED = "accepted for ported configs; another value than the default is ignored with a warning"


def _entrypoint(value: Any) -> Any:
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise ConfigProblems.at(
        (), f"expected a non-empty string or list of strings, got {value!r}; e.g. "
        "`entrypoint: model_def:MyTrial` or `entrypoint: [python3, train.py]`"
    )


def _shm_size(value: Any) -> Any:
    if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ConfigProblems.at((), f"expected a size in bytes or a string like '4G', got {value!r}")


class Optimizations(StrictModel):
    """Gradient aggregation and precision settings."""

    aggregation_frequency: int = Field(default=1, ge=1, description="batches per optimizer step, e.g. `4`")
    average_aggregated_gradients: bool = True
    average_training_metrics: bool = Field(default=True, description=f"always true here; {_IGNORED}")
    gradient_compression: bool = Field(default=False, description=f"Horovod; {_IGNORED}")
    mixed_precision: Literal["O0", "O1", "O2", "O3"] = Field(
        default="O0", description=f"apex AMP; {_IGNORED}: use `context.experimental.use_amp()`")
    tensor_fusion_threshold: int = Field(default=64, ge=0, description=f"Horovod fusion buffer size in MB; {_IGNORED}")
    tensor_fusion_cycle_time: float = Field(
        default=1.0, ge=0, allow_inf_nan=False, description=f"Horovod fusion cycle time in ms; {_IGNORED}")
    auto_tune_tensor_fusion: bool = Field(default=False, description=f"Horovod; {_IGNORED}")

    @model_validator(mode="before")
    @classmethod
    def _cluster_only(cls, data: Any) -> Any:
        return drop_unused_keys(data, "optimizations", cls.model_fields, "optimizations ")


class Mesh(StrictModel):
    """A PyTorchTrial's device mesh: data-parallel replicas x shards x tensor-parallel ranks."""

    dp_replicate: int = Field(default=1, ge=1, description="replicas of the sharded model (HSDP when > 1), e.g. `2`")
    dp_shard: int | None = Field(
        default=None, ge=1, description="ranks one replica is sharded over (FSDP2); default: the slots left, "
                                        "`slots_per_trial / (dp_replicate * tp)`")
    tp: int = Field(default=1, ge=1, description="tensor-parallel ranks (the trial's `parallelize_module` plan), "
                                                 "e.g. `2`")

    @property
    def shape(self) -> tuple[int, int, int]:
        """(dp_replicate, dp_shard, tp); ``dp_shard`` is resolved once the mesh is in ``Resources``."""
        return self.dp_replicate, self.dp_shard or 1, self.tp


class Resources(StrictModel):
    """How many slots (processes/GPUs) a trial uses; the rest is accepted for ported configs."""

    slots_per_trial: int = Field(
        default=1, ge=1, description="processes (GPUs) per trial, e.g. `slots_per_trial: 2`"
    )
    max_slots: int | None = Field(
        default=None, ge=1, description="slots the experiment uses at once: runs `max_slots // slots_per_trial` "
                                        "trials at once (unless `--max-parallel` says otherwise)")
    max_slots_per_node: int | None = Field(
        default=None, ge=1, description="with `--ray`: at most this many of a trial's slots on one Ray node. A "
                                        "trial whose slots do not fit one node (or this cap) is split evenly "
                                        "over several nodes, one launcher per node, e.g. `max_slots_per_node: 8`"
                                        " (default: a node's CPUs, or GPUs); ignored by the local executor")
    warm_processes: bool = Field(
        default=True, description="start each local trial process from a warm parent that imported torch and the "
                                  "model_def once (forked, still a process per trial); `false`: a new interpreter "
                                  "per trial (docs/performance.md#warm-trial-processes)")
    resource_pool: str | None = Field(default=None, description="ignored locally")
    priority: int | None = Field(default=None, description="ignored locally")
    shm_size: Annotated[int | str | None, BeforeValidator(_shm_size)] = Field(
        default=None, description=f"a container's /dev/shm; {_IGNORED}")
    mesh: Mesh | None = Field(
        default=None, description="PyTorchTrial only: the device mesh `context.get_device_mesh()` returns, e.g. "
                                  "`mesh: {dp_shard: 2, tp: 2}` with `slots_per_trial: 4`; the product of its sizes "
                                  "is `slots_per_trial` (default: one `dp_shard` dimension over every slot)")

    @model_validator(mode="before")
    @classmethod
    def _cluster_only(cls, data: Any) -> Any:
        return drop_unused_keys(data, "resources", cls.model_fields, "resources ")

    @model_validator(mode="after")
    def _resolve_mesh(self) -> Resources:
        mesh = self.mesh
        if mesh is None:
            return self
        fixed = mesh.dp_replicate * mesh.tp
        shard = mesh.dp_shard if mesh.dp_shard is not None else self.slots_per_trial // fixed
        if shard < 1 or fixed * shard != self.slots_per_trial:
            sizes = f"dp_replicate {mesh.dp_replicate} x dp_shard {mesh.dp_shard or '(the rest)'} x tp {mesh.tp}"
            raise ConfigProblems.at(
                ("mesh",), f"the mesh ({sizes}) does not make slots_per_trial ({self.slots_per_trial}) ranks: the "
                "product of its sizes must equal slots_per_trial, e.g. "
                "`slots_per_trial: 4, mesh: {dp_shard: 2, tp: 2}`")
        if mesh.dp_shard is None:
            object.__setattr__(self, "mesh", mesh.model_copy(update={"dp_shard": shard}))
        return self


class Reproducibility(StrictModel):
    """The experiment seed from which trial seeds derive."""

    experiment_seed: int | None = Field(
        default=None, ge=0, le=_MAX_SEED,
        description=f"an integer in 0..{_MAX_SEED}, e.g. `experiment_seed: 42`"
    )


class Profiling(StrictModel):
    """The system-metrics profiler."""

    enabled: bool = False
    begin_on_batch: int = Field(default=0, ge=0, description="first profiled batch, e.g. `10`")
    end_after_batch: int | None = Field(default=None, ge=0, description="last profiled batch")
    sync_timings: bool = Field(default=True, description=f"batch timings; {_IGNORED}")

    @model_validator(mode="after")
    def _check_range(self) -> Profiling:
        if self.end_after_batch is not None and self.end_after_batch < self.begin_on_batch:
            raise ConfigProblems.at(
                ("end_after_batch",),
                f"end_after_batch ({self.end_after_batch}) is before begin_on_batch "
                f"({self.begin_on_batch}); make it >= begin_on_batch or leave it out",
            )
        return self


_FreeDict = Annotated[dict[str, Any], BeforeValidator(json_value)]


class ExperimentConfig(StrictModel):
    """A whole experiment configuration, validated once; frozen. Build it with `load_config`."""

    name: str = Field(default="experiment", min_length=1, description="e.g. `name: mnist-const`")
    description: str = ""
    labels: Annotated[tuple[str, ...], Field(strict=False, description="e.g. `labels: [mnist, cnn]`")] = ()
    entrypoint: Annotated[str | tuple[str, ...] | None, BeforeValidator(_entrypoint)] = None
    hyperparameters: HParams = Field(
        default_factory=dict, description="name -> value or `{type: int|double|log|categorical|const, ...}`"
    )
    searcher: SearcherConfig = Field(
        description="e.g. `searcher: {name: single, metric: validation_loss, max_length: {batches: 1000}}`"
    )
    records_per_epoch: int = Field(default=0, ge=0, description="records per epoch (0 = from the data loader)")
    min_validation_period: Period | None = Field(default=None, description="e.g. `{batches: 500}`")
    min_checkpoint_period: Period | None = Field(default=None, description="e.g. `{epochs: 1}`")
    perform_initial_validation: bool = False
    checkpoint_storage: StorageConfig = None
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    scheduling_unit: int = Field(default=100, ge=1, description="batches between metric reports, e.g. `100`")
    optimizations: Optimizations = Optimizations()
    resources: Resources = Resources()
    max_restarts: int = Field(default=5, ge=0, description="how often a failed trial is restarted, e.g. `5`")
    reproducibility: Reproducibility = Reproducibility()
    profiling: Profiling = Profiling()
    integrations: Integrations = Field(
        default_factory=Integrations, description="experiment trackers, e.g. `integrations: {mlflow: {}}`")
    data: _FreeDict = Field(default_factory=dict, description="free-form settings for the trial")
    environment: _FreeDict = Field(default_factory=dict, description="free-form environment settings")
    debug: bool = False

    @model_validator(mode="before")
    @classmethod
    def _cluster_only(cls, data: Any) -> Any:
        data = drop_unused_keys(data, "experiment", cls.model_fields, "")
        return warn_ignored_settings(data, {"optimizations": Optimizations.model_fields,
                                            "resources": Resources.model_fields, "profiling": Profiling.model_fields})

    @model_validator(mode="after")
    def _check_grid(self) -> ExperimentConfig:
        if isinstance(self.searcher, GridSearcher):
            problems = grid_count_problems(self.hyperparameters)
            if problems:
                raise ConfigProblems([(("hyperparameters", *loc), msg) for loc, msg in problems])
        return self

    @model_validator(mode="after")
    def _check_optuna_sampler(self) -> ExperimentConfig:
        if isinstance(self.searcher, OptunaSearcher):
            problems = optuna_sampler_problems(self.hyperparameters, self.searcher)
            if problems:
                raise ConfigProblems([(("hyperparameters", *loc), msg) for loc, msg in problems])
        return self

    def as_dict(self) -> dict[str, Any]:
        """A plain JSON-able dict with every field (defaults filled); `load_config` accepts it."""
        return self.model_dump(mode="json")
