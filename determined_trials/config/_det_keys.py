"""Every key of Determined 0.38's experiment-config schema, by section, so that a ported config is
accepted whole: keys that mean nothing locally are dropped with a `ConfigWarning` (typos still fail)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["DETERMINED_KEYS", "ConfigWarning", "drop_unused_keys"]


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
    "checkpoint_storage.shared_fs": _STORAGE_COMMON | {
        "host_path", "storage_path", "propagation", "container_path", "checkpoint_path", "tensorboard_path",
    },
    "checkpoint_storage.directory": _STORAGE_COMMON | {"container_path"},
    "checkpoint_storage.s3": _STORAGE_COMMON | {"bucket", "access_key", "secret_key", "endpoint_url", "prefix"},
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
}
"""Section -> the keys Determined 0.38 accepts there (searchers and storages by name/type)."""


def drop_unused_keys(data: Any, section: str, fields: Mapping[str, Any], where: str) -> Any:
    """``data`` without the keys Determined knows in ``section`` that we have no field for (warned)."""
    if not isinstance(data, Mapping):
        return data
    known = DETERMINED_KEYS.get(section, frozenset())
    unused = sorted(k for k in data if k in known and k not in fields)
    if unused:
        warnings.warn(
            f"experiment config: ignoring {where}key(s) {', '.join(unused)}: they have no effect when running "
            "locally (Determined uses them on a cluster)",
            ConfigWarning,
            stacklevel=3,
        )
    return {k: v for k, v in data.items() if k not in unused}
