"""Every key of Determined 0.38's experiment-config schema, by section, so that a ported config is
accepted whole: keys that mean nothing locally are dropped with a `ConfigWarning` (typos still fail),
and settings kept in the schema but not acted on here warn when they ask for something."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import pydantic

__all__ = ["CONFIG_WARNED_ENV", "DETERMINED_KEYS", "IGNORED_SETTINGS", "ConfigWarning", "drop_unused_keys",
           "warn_config", "warn_ignored_settings"]

CONFIG_WARNED_ENV = "DET_CONFIG_WARNED"
"""Set (to 1) in a trial process whose experiment runner already showed the config's warnings: not again."""


class ConfigWarning(UserWarning):
    """A config key was accepted but has no effect locally (e.g. cluster-only settings)."""


_SEARCHER_COMMON = frozenset({
    "name", "metric", "smaller_is_better", "max_length", "source_trial_id", "source_checkpoint_uuid",
})
_STORAGE_COMMON = frozenset({"type", "save_experiment_best", "save_trial_best", "save_trial_latest"})

DETERMINED_KEYS: Mapping[str, frozenset[str]] = {
    "experiment": frozenset({
        "bind_mounts", "checkpoint_policy", "checkpoint_storage", "data", "data_layer", "debug", "description",
        "entrypoint", "environment", "hyperparameters", "integrations", "internal", "labels", "log_policies",
        "max_restarts", "min_checkpoint_period", "min_validation_period", "name", "optimizations", "pbs",
        "perform_initial_validation", "preemption_timeout", "profiling", "project", "records_per_epoch",
        "reproducibility", "resources", "retention_policy", "scheduling_unit", "searcher", "security", "slurm",
        "tensorboard_storage", "workspace",
    }),
    "searcher.single": _SEARCHER_COMMON,
    "searcher.random": _SEARCHER_COMMON | {"max_trials", "max_concurrent_trials"},
    "searcher.grid": _SEARCHER_COMMON | {"max_concurrent_trials"},
    "searcher.adaptive_asha": _SEARCHER_COMMON | {
        "bracket_rungs", "max_trials", "mode", "divisor", "max_rungs", "max_concurrent_trials", "time_metric",
        "max_time", "stop_once",
    },
    "searcher.pbt": _SEARCHER_COMMON | {
        "population_size", "num_rounds", "length_per_round", "replace_function", "explore_function",
    },
    "checkpoint_storage.shared_fs": _STORAGE_COMMON | {
        "host_path", "storage_path", "propagation", "container_path", "checkpoint_path", "tensorboard_path",
    },
    "checkpoint_storage.directory": _STORAGE_COMMON | {"container_path"},
    "checkpoint_storage.s3": _STORAGE_COMMON | {"bucket", "access_key", "secret_key", "endpoint_url", "prefix"},
    "checkpoint_storage.gcs": _STORAGE_COMMON | {"bucket", "prefix"},
    "checkpoint_storage.azure": _STORAGE_COMMON | {"container", "connection_string", "account_url", "credential"},
    "resources": frozenset({
        "agent_label", "devices", "is_single_node", "max_slots", "native_parallel", "priority", "resource_pool",
        "shm_size", "slots", "slots_per_trial", "weight",
    }),
    "optimizations": frozenset({
        "aggregation_frequency", "auto_tune_tensor_fusion", "average_aggregated_gradients",
        "average_training_metrics", "grad_updates_size_file", "gradient_compression", "mixed_precision",
        "tensor_fusion_cycle_time", "tensor_fusion_threshold",
    }),
    "profiling": frozenset({"enabled", "begin_on_batch", "end_after_batch", "sync_timings"}),
    "reproducibility": frozenset({"experiment_seed"}),
    "integrations": frozenset({"pachyderm"}),
}
"""Section -> the keys Determined 0.38 accepts there (searchers and storages by name/type)."""

_HOROVOD = "a Horovod setting: training here runs on torch.distributed (DDP) or DeepSpeed, which do their own bucketing"
IGNORED_SETTINGS: Mapping[str, Mapping[str, str]] = {
    "optimizations": {
        "mixed_precision": "Determined's apex AMP; for mixed precision call `context.experimental.use_amp()` "
                           "in the PyTorchTrial's __init__ (or use `context.autocast()` and `context.wrap_scaler`)",
        "average_training_metrics": "training metrics are always averaged over the processes here",
        "gradient_compression": _HOROVOD,
        "tensor_fusion_threshold": _HOROVOD,
        "tensor_fusion_cycle_time": _HOROVOD,
        "auto_tune_tensor_fusion": _HOROVOD,
    },
    "resources": {"shm_size": "trials run as processes on this machine, not in a container: they share its /dev/shm"},
    "profiling": {"sync_timings": "the profiler records system metrics only, no synchronised batch timings"},
}
"""Section -> settings the schema keeps (ported configs round-trip) but nothing acts on, and why."""

_SKIPPED = (str(Path(pydantic.__file__).parent), str(Path(__file__).parents[1]))
_CONFIG_PACKAGE = str(Path(__file__).parent)


def _stacklevel() -> int:
    """``warnings.warn``'s stacklevel, called from ``warn_config``: the first frame outside pydantic and
    determined_trials (the user's call), else outside pydantic and the config package (a det-trials
    command, a launcher)."""
    frames = []
    frame: FrameType | None = sys._getframe(2)  # warn_config's caller
    while frame is not None:
        frames.append(frame.f_code.co_filename)
        frame = frame.f_back
    for skipped in (_SKIPPED, (_SKIPPED[0], _CONFIG_PACKAGE)):
        for level, name in enumerate(frames, start=2):
            if not name.startswith((*skipped, "<frozen ")):
                return level
    return 2


def warn_config(message: str) -> None:
    """A ``ConfigWarning`` attributed to the code that loaded the config, not to pydantic (none in a
    trial process whose runner showed it already)."""
    if os.environ.get(CONFIG_WARNED_ENV) == "1":
        return
    warnings.warn(message, ConfigWarning, stacklevel=_stacklevel())


def warn_ignored_settings(data: Any, sections: Mapping[str, Mapping[str, Any]]) -> Any:
    """``data`` (a whole config) unchanged; one warning naming each ``IGNORED_SETTINGS`` key set to
    something other than its default (``sections``: section -> its model's fields; a default asks for
    nothing, as in a whole 0.38 config)."""
    if not isinstance(data, Mapping):
        return data
    said = []
    for section, hints in IGNORED_SETTINGS.items():
        values, fields = data.get(section), sections[section]
        if isinstance(values, Mapping):
            said += [f"{section}.{key}: {values[key]!r} ({hint})" for key, hint in hints.items()
                     if values.get(key) is not None and values[key] != fields[key].default]
    if said:
        warn_config("experiment config: ignoring " + "; ".join(said))
    return data


def drop_unused_keys(data: Any, section: str, fields: Mapping[str, Any], where: str) -> Any:
    """``data`` without the keys Determined knows in ``section`` that we have no field for (warned)."""
    if not isinstance(data, Mapping):
        return data
    known = DETERMINED_KEYS.get(section, frozenset())
    unused = sorted(k for k in data if k in known and k not in fields)
    if unused:
        warn_config(f"experiment config: ignoring {where}key(s) {', '.join(unused)}: they have no effect when "
                    "running locally (Determined uses them on a cluster)")
    return {k: v for k, v in data.items() if k not in unused}
