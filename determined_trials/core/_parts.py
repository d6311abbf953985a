"""The parts of a Core API ``Context`` bound to one trial (train, checkpoint, searcher, profiler), built once
the context's trial is settled, and what records a trial's checkpoints in the store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from determined_trials._info import ClusterInfo, TrialInfo
from determined_trials.config import ExperimentConfig
from determined_trials.core._checkpoint import CheckpointContext, CheckpointRecorder
from determined_trials.core._distributed import DistributedContext
from determined_trials.core._profiler import ProfilerContext
from determined_trials.core._searcher import SearcherContext, SingleOperationSource, Unit
from determined_trials.core._train import TensorboardMode, TrainContext
from determined_trials.core.storage import StorageManager
from determined_trials.core.store import TrialStore, recover_checkpoints
from determined_trials.core.trackers import TrialFacts, fork_parent_runs, tensorboard_dir

__all__ = ["PartsMaker", "TrialParts"]


class TrialParts(NamedTuple):
    """The contexts that report, checkpoint and search for one trial."""

    checkpoint: CheckpointContext
    train: TrainContext
    searcher: SearcherContext
    profiler: ProfilerContext


class PartsMaker:
    """Builds a trial's ``TrialParts`` from what ``core.init`` resolved (the store, storage, distributed
    context, TensorBoard mode, run folder, config and the launcher's facts)."""

    def __init__(self, store: TrialStore, storage: StorageManager, dist: DistributedContext, mode: TensorboardMode,
                 run_path: Path, config: ExperimentConfig, launched: ClusterInfo | None) -> None:
        self._store, self._storage, self._dist, self._mode = store, storage, dist, mode
        self._run_path, self._config, self._launched = run_path, config, launched

    @property
    def config(self) -> ExperimentConfig:
        return self._config

    def tracker_facts(self, trial: TrialInfo, restart_step: int | None) -> TrialFacts:
        """What the trial's tracker runs (TensorBoard's, with ``TensorboardMode.AUTO``) record of it; ``restart_step``:
        the first step this process trains."""
        tb_dir = tensorboard_dir(self._run_path, trial.experiment_id, trial.trial_id)
        return TrialFacts(trial=trial, experiment_name=self._store.experiment(trial.experiment_id).name,
                          searcher_metric=self._config.searcher.metric, run_dir=str(self._run_path),
                          parent_runs=fork_parent_runs(self._store, trial.trial_id),
                          tensorboard_dir=str(tb_dir) if self._mode is TensorboardMode.AUTO else None,
                          restart_step=restart_step)

    def __call__(self, trial: TrialInfo) -> TrialParts:
        store, dist = self._store, self._dist
        if dist.get_rank() == 0:  # settle what a killed writer of this trial left behind
            recover_checkpoints(store, self._storage, trial.trial_id)
        train = self._train(trial)
        recorder = _StoreRecorder(store, trial.trial_id, str(self._storage), before_record=train.flush_reports)
        return TrialParts(
            checkpoint=CheckpointContext(dist, self._storage, recorder=recorder),
            train=train,
            searcher=self._searcher(trial, before_record=train.flush_reports),
            profiler=ProfilerContext(dist, _profiler_reporter(store, trial.trial_id)),
        )

    def _train(self, trial: TrialInfo) -> TrainContext:
        return TrainContext(
            store=self._store, trial_id=trial.trial_id, experiment_id=trial.experiment_id, dist=self._dist,
            tensorboard_dir=tensorboard_dir(self._run_path, trial.experiment_id, trial.trial_id),
            searcher_metric=self._config.searcher.metric, smaller_is_better=self._config.searcher.smaller_is_better,
        )

    def _searcher(self, trial: TrialInfo, *, before_record: Callable[[], None]) -> SearcherContext:
        max_length = self._config.searcher.max_length
        length = max_length.value if max_length is not None else 1
        units = Unit.from_name(max_length.unit) if max_length is not None else None
        info = self._launched
        lengths = info.searcher_lengths if info is not None and info.searcher_lengths else [length]
        return SearcherContext(
            self._dist, source=SingleOperationSource(*lengths), trial_id=trial.trial_id,
            store=self._store, units=units, max_length=max(length, *lengths), before_record=before_record,
        )


def _profiler_reporter(store: TrialStore, trial_id: int) -> Any:
    def report(group: str, steps: int, metrics: dict[str, Any]) -> None:
        store.add_metrics(trial_id=trial_id, group=group, steps_completed=steps, metrics=metrics)

    return report


class _StoreRecorder(CheckpointRecorder):
    """Records checkpoints of one trial in the store (what the cluster master would do)."""

    def __init__(self, store: TrialStore, trial_id: int, storage: str, before_record: Callable[[], None]) -> None:
        self._store = store
        self._trial_id = trial_id
        self._storage = storage
        self._before_record = before_record  # metrics reported before a checkpoint are stored before it

    def checkpoint_saved(self, storage_id: str, metadata: dict[str, Any], resources: dict[str, int]) -> None:
        self._before_record()
        self._store.add_checkpoint(
            uuid=storage_id, trial_id=self._trial_id, steps_completed=int(metadata["steps_completed"]),
            metadata=metadata, resources=resources, storage=self._storage,
        )

    def checkpoint_pending(self, storage_id: str, metadata: dict[str, Any]) -> None:
        self._before_record()
        self._store.add_checkpoint(
            uuid=storage_id, trial_id=self._trial_id, steps_completed=int(metadata.get("steps_completed", 0)),
            metadata=metadata, resources={}, storage=self._storage, pending=True,
        )

    def checkpoint_dropped(self, storage_id: str) -> None:
        self._store.drop_pending_checkpoint(storage_id)

    def checkpoint_deleted(self, storage_id: str) -> None:
        self._store.mark_checkpoint_deleted(storage_id)
