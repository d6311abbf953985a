"""A fork of a checkpoint of another run folder: where that folder is (``--checkpoint PATH`` or ``--from-run-dir``),
and the checkpoint's files copied into this run folder's storage and recorded in its store, with where it came from
(the source run folder is only read)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

from determined_trials.core.storage import DirectoryStorage, StorageManager, storage_from_spec
from determined_trials.core.store import STORE_FILENAME, CheckpointState, LocalStore, NotFoundError
from determined_trials.errors import ConfigError

__all__ = ["FORKED_FROM", "ForeignCheckpoint", "adopt_checkpoint", "check_fork_storage", "foreign_parent",
           "locate_checkpoint"]

FORKED_FROM = "forked_from"
"""The key of an adopted checkpoint's recorded metadata naming where it came from (run_dir, experiment and trial)."""

_METADATA = "metadata.json"


@dataclasses.dataclass(frozen=True)
class ForeignCheckpoint:
    """A checkpoint of another run folder: that folder, the checkpoint's storage there (its experiment's
    ``checkpoint_storage``), the trial and experiment that wrote it and its step."""

    run_dir: str
    storage: Any
    experiment_id: int
    trial_id: int
    steps_completed: int


def locate_checkpoint(checkpoint: str, from_run_dir: str | os.PathLike[str] | None,
                      here: Path) -> tuple[str, Path | None]:
    """The checkpoint's uuid and the run folder holding it: ``from_run_dir``, or for a checkpoint folder path
    the nearest folder above it with a store; None for this run folder ``here`` (a uuid without
    ``from_run_dir``). ``ConfigError`` for a path that is not a checkpoint or no run folder found."""
    is_path = os.sep in checkpoint or (os.altsep is not None and os.altsep in checkpoint) or Path(checkpoint).is_dir()
    uuid = checkpoint
    source = None if from_run_dir is None else Path(from_run_dir).absolute()
    if is_path:
        folder = Path(checkpoint).expanduser().absolute()
        if not (folder / _METADATA).is_file():
            why = "it does not exist" if not folder.exists() else f"it holds no {_METADATA}"
            raise ConfigError(f"--checkpoint {checkpoint} is not a checkpoint folder: {why} (a checkpoint folder is "
                              f"<storage>/<uuid> and holds {_METADATA})")
        uuid = folder.name
        if source is None:
            source = next((p for p in folder.parents if (p / STORE_FILENAME).is_file()), None)
        if source is None:
            raise ConfigError(f"--checkpoint {checkpoint}: no folder above it is a run folder (none holds "
                              f"{STORE_FILENAME}); name the run folder that wrote it with --from-run-dir")
    if source is not None and source.resolve() == here.resolve():
        source = None
    return uuid, source


def foreign_parent(source: Path, uuid: str) -> tuple[ForeignCheckpoint, Any, Any]:
    """The checkpoint ``uuid`` of run folder ``source`` (opened, never written): where it is, its trial and
    experiment records. ``ConfigError`` when the folder has no store or no such completed checkpoint."""
    try:
        store = LocalStore(source, create=False)
    except FileNotFoundError as exc:
        raise ConfigError(f"--from-run-dir: {exc}") from None
    try:
        try:
            record = store.checkpoint(uuid)
        except NotFoundError:
            raise ConfigError(f"run folder {source} has no checkpoint {uuid}; `det-trials --run-dir {source} "
                              "checkpoint list` shows its checkpoints") from None
        if record.state != CheckpointState.COMPLETED or record.trial_id is None:
            raise ConfigError(f"checkpoint {uuid} of run folder {source} is {record.state.lower()}: its files are gone")
        trial = store.trial(record.trial_id)
        exp = store.experiment(trial.experiment_id)
    finally:
        store.close()
    spec = exp.config.get("checkpoint_storage")
    where = ForeignCheckpoint(str(source), spec, exp.id, trial.id, record.steps_completed)
    return where, trial, exp


def check_fork_storage(where: ForeignCheckpoint, spec: Any, here: Path) -> None:
    """A fork of another run folder's checkpoint must not write its checkpoints into that folder."""
    storage = storage_from_spec(spec, default_dir=here / "checkpoints")
    if isinstance(storage, DirectoryStorage) and storage.path.resolve().is_relative_to(Path(where.run_dir).resolve()):
        raise ConfigError(f"the parent's checkpoint_storage ({storage.describe()}) is inside run folder "
                          f"{where.run_dir}: give the fork its own, e.g. --set checkpoint_storage=null (this run "
                          "folder's checkpoints/)")


def adopt_checkpoint(uuid: str, where: ForeignCheckpoint, spec: Any, here: Path) -> None:
    """Copy checkpoint ``uuid`` from ``where`` into the storage ``spec`` of run folder ``here`` and record it in
    this store without a trial (``metadata[FORKED_FROM]`` names its origin); nothing when already recorded."""
    store = LocalStore(here)
    try:
        try:
            store.checkpoint(uuid)
            return  # adopted by an earlier fork of it
        except NotFoundError:
            pass
        source = storage_from_spec(where.storage, default_dir=Path(where.run_dir) / "checkpoints")
        target = storage_from_spec(spec, default_dir=here / "checkpoints")
        metadata = source.read_metadata(uuid)
        resources = target.list_files(uuid) if target.exists(uuid) else _copy(source, target, uuid, metadata)
        origin = {"run_dir": where.run_dir, "experiment_id": where.experiment_id, "trial_id": where.trial_id}
        store.add_checkpoint(uuid=uuid, trial_id=None, steps_completed=where.steps_completed,
                             metadata={**metadata, FORKED_FROM: origin}, resources=resources, storage=str(target))
    finally:
        store.close()


def _copy(source: StorageManager, target: StorageManager, uuid: str, metadata: dict[str, Any]) -> dict[str, int]:
    """The checkpoint's files (its metadata.json as it is) through ``target``'s two-phase write."""
    files = [f for f in source.list_files(uuid) if f != _METADATA]
    try:
        stage = target.stage_dir(uuid, 0)
        if target.stages_in_place:
            source.download_files(uuid, stage, files)
        else:
            with tempfile.TemporaryDirectory(prefix=f"det-fork-{uuid[:8]}-") as tmp:
                source.download_files(uuid, Path(tmp), files)
                target.put(uuid, 0, Path(tmp), files)
        resources = target.commit(uuid, metadata)
    except BaseException:
        target.abort(uuid)
        raise
    finally:
        target.release(uuid, 0)
    return resources
