"""``det-trials trial fork``: a new experiment of the run folder whose one trial continues a checkpoint exactly
(models, optimizers, LR schedulers, scalers, RNGs, data position and counters, as a resume or a PBT child), with
the parent's model code, seed and hyperparameters unless ``--config`` or ``--set`` changes them, and its lineage
recorded; the checkpoint may be another run folder's (``_fork_source``)."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from determined_trials.core import resolve_run_dir
from determined_trials.core.store import CheckpointState, LocalStore, NotFoundError
from determined_trials.errors import ConfigError
from determined_trials.experiment._fork_source import (
    FORKED_FROM,
    ForeignCheckpoint,
    adopt_checkpoint,
    check_fork_storage,
    foreign_parent,
    locate_checkpoint,
)

__all__ = ["ForkStart", "adopt_foreign", "fork_plan"]


@dataclasses.dataclass(frozen=True)
class ForkStart:
    """What the fork's trial starts from: the checkpoint it continues, the trial that wrote it (None for another
    run folder's) and its seed."""

    checkpoint: str
    parent_trial_id: int | None
    seed: int


@dataclasses.dataclass(frozen=True)
class ForkPlan:
    """A fork ready to create: its config, the parent's model folder (snapshotted again), its start and, for a
    checkpoint of another run folder, where that is (``adopt_foreign`` copies it in)."""

    config: dict[str, Any]
    model_dir: Path
    start: ForkStart
    foreign: ForeignCheckpoint | None = None


def fork_plan(*, trial_id: int | None = None, checkpoint: str | None = None, overrides: tuple[str, ...] = (),
              max_length: int | None = None, run_dir: str | os.PathLike[str] | None = None,
              config_file: str | os.PathLike[str] | None = None,
              from_run_dir: str | os.PathLike[str] | None = None) -> ForkPlan:
    """The fork of trial ``trial_id`` (its latest checkpoint) or of ``checkpoint``: the parent experiment's
    config with a ``single`` searcher, the parent trial's hyperparameters as constants, ``config_file`` (a YAML
    mapping of the settings to change) then ``overrides`` (``KEY.PATH=VALUE``, the value read as YAML) applied,
    and ``max_length`` (in the parent's unit, counted from the start of the lineage) when given. ``checkpoint``
    may be a checkpoint folder of another run folder, or a uuid of ``from_run_dir``'s. ``ConfigError`` for an
    unknown trial or checkpoint, a path that is not a checkpoint, or a bad override."""
    here = resolve_run_dir(run_dir)
    foreign = None
    if checkpoint is not None:
        checkpoint, source = locate_checkpoint(checkpoint, from_run_dir, here)
        source = source or _adopted_from(here, checkpoint)
        if source is not None:
            foreign, parent, exp = foreign_parent(source, checkpoint)
            uuid, steps = checkpoint, foreign.steps_completed
    elif from_run_dir is not None:
        raise ConfigError("--from-run-dir names where --checkpoint is; give --checkpoint UUID with it")
    if foreign is None:
        store = LocalStore(here, create=False)
        try:
            uuid, parent = _parent(store, trial_id, checkpoint)
            exp = store.experiment(parent.experiment_id)
            steps = store.checkpoint(uuid).steps_completed
        finally:
            store.close()
    if exp.model_dir is None:
        raise ConfigError(f"trial {parent.id}'s experiment {exp.id} keeps no model folder to fork from")
    config = copy.deepcopy(exp.config)
    searcher = config.get("searcher") or {}
    length = dict(searcher.get("max_length") or {})
    if max_length is not None:
        if len(length) != 1:
            raise ConfigError(f"--max-length: experiment {exp.id} has no max_length to take the unit from")
        length = {next(iter(length)): int(max_length)}
    if list(length) == ["batches"] and length["batches"] <= steps:
        raise ConfigError(f"the fork would train nothing: checkpoint {uuid} is at batch {steps} and max_length is "
                          f"{length['batches']} batches (counted from the start of the lineage); give a larger "
                          "--max-length")
    config["searcher"] = {"name": "single", "metric": searcher.get("metric"),
                          "smaller_is_better": searcher.get("smaller_is_better", True), "max_length": length}
    config["hyperparameters"] = copy.deepcopy(parent.hparams)
    config["name"] = f"{exp.name} (fork of trial {parent.id}{'' if foreign is None else ' of ' + foreign.run_dir})"
    if config_file is not None:
        for keys, value in _config_file_leaves(config_file):
            _set(config, keys, value, f"--config {config_file}: {'.'.join(keys)}")
    for override in overrides:
        _apply(config, override)
    if config["hyperparameters"].get("global_batch_size") != parent.hparams.get("global_batch_size"):
        raise ConfigError("a fork cannot change global_batch_size: the checkpoint's data position and counters are "
                          "in batches of the parent's size; warm-start a new experiment from it instead "
                          "(searcher.source_checkpoint_uuid)")
    if foreign is not None:
        check_fork_storage(foreign, config.get("checkpoint_storage"), here)
    start = ForkStart(uuid, parent.id if foreign is None else None, parent.seed)
    return ForkPlan(config, Path(exp.model_dir), start, foreign)


def adopt_foreign(plan: ForkPlan, run_dir: str | os.PathLike[str] | None) -> None:
    """Copy a fork's checkpoint of another run folder into this one's storage and store (nothing for a local one)."""
    if plan.foreign is not None:
        adopt_checkpoint(plan.start.checkpoint, plan.foreign, plan.config.get("checkpoint_storage"),
                         resolve_run_dir(run_dir))


def _adopted_from(here: Path, uuid: str) -> Path | None:
    """The run folder an earlier fork adopted checkpoint ``uuid`` from (its lineage is that folder's); else None."""
    try:
        store = LocalStore(here, create=False)
    except FileNotFoundError:
        return None  # a new run folder: the fork makes it
    try:
        origin = store.checkpoint(uuid).metadata.get(FORKED_FROM)
    except NotFoundError:
        return None
    finally:
        store.close()
    return Path(origin["run_dir"]) if isinstance(origin, dict) else None


def _parent(store: LocalStore, trial_id: int | None, checkpoint: str | None) -> tuple[str, Any]:
    if (trial_id is None) == (checkpoint is None):
        raise ConfigError("fork takes a trial id or --checkpoint UUID (one of them)")
    try:
        if checkpoint is not None:
            record = store.checkpoint(checkpoint)
            if record.state != CheckpointState.COMPLETED or record.trial_id is None:
                raise ConfigError(f"checkpoint {checkpoint} is {record.state.lower()}: its files are gone")
            return checkpoint, store.trial(record.trial_id)
        assert trial_id is not None
        parent = store.trial(trial_id)
    except NotFoundError as exc:
        raise ConfigError(f"{exc}; `det-trials checkpoint list` and `trial list` show the run folder's") from None
    latest = store.latest_checkpoint(trial_id)
    if latest is None:
        raise ConfigError(f"trial {trial_id} has no checkpoint to fork from")
    return latest.uuid, parent


def _apply(config: dict[str, Any], override: str) -> None:
    """``KEY.PATH=VALUE`` into ``config`` (VALUE as YAML: ``0.01``, ``true``, ``{batches: 10}``)."""
    path, sep, text = override.partition("=")
    keys = [k for k in path.strip().split(".") if k]
    if not sep or not keys:
        raise ConfigError(f"--set {override!r}: write KEY.PATH=VALUE, e.g. --set hyperparameters.lr=0.01")
    _set(config, keys, yaml.safe_load(text), f"--set {override!r}")


def _config_file_leaves(path: str | os.PathLike[str]) -> Iterator[tuple[list[str], Any]]:
    """The settings of a ``--config`` YAML file as (key path, value): each leaf of its nested mappings, so that
    it changes only what it names (``searcher.max_length`` is one value: its unit may change)."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--config {path}: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"--config {path}: write a mapping of the settings to change, e.g. "
                          "`hyperparameters: {lr: 0.01}`")

    def leaves(node: dict[str, Any], route: list[str]) -> Iterator[tuple[list[str], Any]]:
        for key, value in node.items():
            keys = [*route, str(key)]
            if isinstance(value, dict) and value and keys != ["searcher", "max_length"]:
                yield from leaves(value, keys)
            else:
                yield keys, value

    yield from leaves(loaded, [])


def _set(config: dict[str, Any], keys: list[str], value: Any, shown: str) -> None:
    """``value`` at ``keys`` in ``config`` (sections made as needed); ``shown`` names the setting in errors."""
    if keys[0] == "searcher" and keys[1:2] not in (["max_length"], ["metric"], ["smaller_is_better"]):
        raise ConfigError(f"{shown}: a fork's searcher is `single`; only searcher.max_length, metric "
                          "and smaller_is_better may change")
    target = config
    for key in keys[:-1]:
        if target.get(key) is None:
            target[key] = {}
        target = target[key]
        if not isinstance(target, dict):
            raise ConfigError(f"{shown}: {key} is not a section")
    target[keys[-1]] = value
