"""Experiment configuration: the frozen typed `ExperimentConfig`, `load_config`, and the
hyperparameter helpers (`sample_hparams`, `grid_points`).

Owns YAML loading with a budget (``_load``), the pydantic schema, hyperparameter specs with grid and random
sampling, the checkpoint storage section with every rule about it (``parse_storage``: a path, URI or mapping
-> the typed section the storage backends take), and the generated reference (``_reference``).

May import: errors
"""

from determined_trials.config._det_keys import CONFIG_WARNED_ENV
from determined_trials.config._hparams import (
    CategoricalHP,
    ConstHP,
    DoubleHP,
    HParamSpec,
    IntHP,
    LogHP,
    grid_points,
    hparam_leaves,
    parse_space,
    sample_hparam,
    sample_hparams,
)
from determined_trials.config._integrations import Integrations, MlflowIntegration, WandbIntegration
from determined_trials.config._length import Length, LengthUnit
from determined_trials.config._load import ConfigSource, load_config, load_raw, validate_raw
from determined_trials.config._schema import (
    ConfigWarning,
    ExperimentConfig,
    Mesh,
    Optimizations,
    Profiling,
    Reproducibility,
    Resources,
)
from determined_trials.config._searcher import (
    AdaptiveASHASearcher,
    GridSearcher,
    OptunaSearcher,
    OptunaWarmStart,
    PBTSearcher,
    RandomSearcher,
    SearcherConfig,
    SingleSearcher,
    default_searcher,
)
from determined_trials.config._storage import (
    AZURE_CONNECTION_ENV,
    AzureStorage,
    DirectoryStorage,
    GCSStorage,
    S3Storage,
    SharedFSStorage,
    StorageConfig,
    StorageSection,
    parse_storage,
)

__all__ = [
    "AZURE_CONNECTION_ENV",
    "AdaptiveASHASearcher",
    "AzureStorage",
    "CategoricalHP",
    "ConfigSource",
    "ConfigWarning",
    "ConstHP",
    "DirectoryStorage",
    "DoubleHP",
    "ExperimentConfig",
    "GCSStorage",
    "GridSearcher",
    "PBTSearcher",
    "HParamSpec",
    "IntHP",
    "Length",
    "LengthUnit",
    "LogHP",
    "OptunaSearcher",
    "OptunaWarmStart",
    "Optimizations",
    "Profiling",
    "Integrations",
    "MlflowIntegration",
    "WandbIntegration",
    "RandomSearcher",
    "Reproducibility",
    "Mesh",
    "Resources",
    "S3Storage",
    "SearcherConfig",
    "SharedFSStorage",
    "SingleSearcher",
    "StorageConfig",
    "StorageSection",
    "grid_points",
    "hparam_leaves",
    "parse_space",
    "parse_storage",
    "load_config",
    "sample_hparams",
    "CONFIG_WARNED_ENV",
    "default_searcher",
    "load_raw",
    "sample_hparam",
    "validate_raw",
]
