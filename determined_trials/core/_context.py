"""``core.init()`` and ``Context``: wire the Core API contexts to the run folder and tear them down.

``init`` resolves the configuration, the run folder and the trial (from the launcher's cluster info,
or registering a new experiment and trial for a bare script), then builds every context. Entering
the ``Context`` starts what runs in the background; leaving it stops everything, also on errors.
"""

from __future__ import annotations

import logging
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from determined_trials._info import ClusterInfo, TrialInfo, get_cluster_info
from determined_trials.config import ExperimentConfig, load_config, sample_hparams
from determined_trials.core._checkpoint import CheckpointContext
from determined_trials.core._distributed import DistributedContext
from determined_trials.core._preempt import PreemptContext, PreemptMode
from determined_trials.core._profiler import ProfilerContext
from determined_trials.core._resume import continue_bare_run, resume_timeline
from determined_trials.core._searcher import (
    SearcherContext,
    SingleOperationSource,
    Unit,
)
from determined_trials.core._train import EarlyExitReason, TensorboardMode, TrainContext
from determined_trials.core.channel import open_store
from determined_trials.core.storage import storage_from_spec
from determined_trials.core.store import (
    LocalStore,
    RunState,
    claim_experiment,
    recover_checkpoints,
    recover_run_checkpoints,
    remove_stale_staging,
)
from determined_trials.core.trackers import Outcome, TrackerForwarder, TrialFacts, check_trackers, open_forwarder
from determined_trials.errors import InvalidHP, TrainingInterrupted

__all__ = ["DEFAULT_RUN_DIR", "RUN_DIR_ENV", "Context", "init", "resolve_run_dir"]

logger = logging.getLogger("determined_trials.core")

RUN_DIR_ENV = "DET_RUN_DIR"
LAUNCH_DIR_ENV = "DET_LAUNCH_DIR"
PREEMPTED_MARKER = "preempted"
DEFAULT_RUN_DIR = "det-runs"
ConfigSource = str | os.PathLike[str] | dict[str, Any] | ExperimentConfig


def resolve_run_dir(run_dir: str | os.PathLike[str] | None = None, info: ClusterInfo | None = None) -> Path:
    """The run folder: the argument, else the launcher's, else ``$DET_RUN_DIR``, else ``./det-runs``."""
    if run_dir is not None:
        return Path(run_dir).absolute()
    if info is not None:
        return Path(info.run_dir).absolute()
    return Path(os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR).absolute()


class Context:
    """The Core API: ``.checkpoint``, ``.distributed``, ``.preempt``, ``.train``, ``.searcher``,
    ``.profiler`` and ``.info``. Build it with ``det.core.init()``, use it in a ``with`` block."""

    def __init__(
        self,
        *,
        checkpoint: CheckpointContext,
        distributed: DistributedContext,
        preempt: PreemptContext,
        train: TrainContext,
        searcher: SearcherContext,
        profiler: ProfilerContext,
        info: ClusterInfo,
        store: LocalStore,
        owns_distributed: bool = False,
    ) -> None:
        self.checkpoint = checkpoint
        self.distributed = distributed
        self.preempt = preempt
        self.train = train
        self.searcher = searcher
        self.profiler = profiler
        self.info = info
        self.store = store
        self._owns_distributed = owns_distributed
        self._closed = False
        self._rebuild: Callable[[TrialInfo], dict[str, Any]] | None = None
        self._config_written = True  # False when init() made up the config (no config, no launcher)
        self._tracking: tuple[ExperimentConfig, Path] | None = None  # the config naming trackers, the run folder
        self._trackers: TrackerForwarder | None = None
        self._ending = Outcome.PAUSED  # until __exit__ says how the trial ended: only covered rows are final

    def _retarget(self, trial: TrialInfo) -> None:
        """Report to ``trial`` from now on (a plain script resuming an earlier run's trial)."""
        assert self._rebuild is not None, "only a plain script's context can continue another trial"
        self.train.close()
        for name, part in self._rebuild(trial).items():
            setattr(self, name, part)

    def __enter__(self) -> Context:
        self.preempt.start()
        self._trackers = self._start_trackers()
        return self

    def _start_trackers(self) -> TrackerForwarder | None:
        """The chief's forwarder of this trial's tracker runs (started once the trial is known for good)."""
        if self._tracking is None or self.distributed.get_rank() != 0:
            return None
        config, run_path = self._tracking
        trial = self.info.trial
        facts = TrialFacts(trial=trial, experiment_name=self.store.experiment(trial.experiment_id).name,
                           searcher_metric=config.searcher.metric, run_dir=str(run_path))
        return open_forwarder(self.store, facts, config.integrations)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        invalid_hp = isinstance(exc, InvalidHP)
        self._ending = _outcome(exc, invalid_hp, self.preempt.acknowledged)
        try:
            if invalid_hp:
                logger.info("trial ended early with InvalidHP: %s", exc)
                self.train.report_early_exit(EarlyExitReason.INVALID_HP)
            self._record_final_state(exc if not invalid_hp else None)
        finally:
            self.close()
        return invalid_hp

    def close(self) -> None:
        """Stop background work, restore signal handlers, close files and sockets; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.profiler.off()
        self.train.close()
        if self._trackers is not None:  # after the last reports reached the store
            self._trackers.finish(self._ending)
        self.preempt.close()
        if self._owns_distributed:
            self.distributed.close()

    def _record_final_state(self, exc: BaseException | None) -> None:
        if self.distributed.get_rank() != 0:
            return
        trial_id = self.info.trial.trial_id
        if isinstance(exc, TrainingInterrupted):
            exc = None  # Ctrl-C stopped training with a checkpoint: resumable, not an error
        if exc is not None:
            state, reason = RunState.ERROR, f"{type(exc).__name__}: {exc}"
        elif self.preempt.acknowledged:
            state, reason = RunState.PAUSED, "preempted"
            _mark_preempted_for_launcher()
        else:
            state, reason = RunState.COMPLETED, None
        self.store.set_trial_state(trial_id, state, reason)
        if get_cluster_info() is None:  # a bare script is its own one-trial experiment
            self.store.set_experiment_state(self.info.trial.experiment_id, state, reason)


def _outcome(exc: BaseException | None, invalid_hp: bool, preempted: bool) -> Outcome:
    """What a tracker run says of how the trial process ended."""
    if isinstance(exc, TrainingInterrupted):
        return Outcome.KILLED
    if exc is not None and not invalid_hp:
        return Outcome.FAILED
    return Outcome.PAUSED if preempted else Outcome.COMPLETED


def _mark_preempted_for_launcher() -> None:
    """Under a det-trials launcher, leave the marker that makes it exit "preempted, resumable"."""
    folder = os.environ.get(LAUNCH_DIR_ENV)
    if folder and Path(folder).is_dir():
        (Path(folder) / PREEMPTED_MARKER).write_text("preempted\n")


def init(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | os.PathLike[str] | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
    config: ConfigSource | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    latest_checkpoint: str | None = None,
) -> Context:
    """Build a Core API ``Context``; use it as ``with det.core.init() as core_context:``.

    ``config`` (a path, dict or parsed config), ``run_dir`` and ``latest_checkpoint`` are local additions:
    the experiment configuration (hyperparameters, searcher, checkpoint storage), the run folder and the
    checkpoint a plain script resumes from (a uuid, or ``"latest"``: the newest of an earlier run with
    the same experiment name). A resumed plain script continues the trial that wrote the checkpoint, and
    ``core_context.info.latest_checkpoint`` names it, as under a launcher. Under a launcher all three
    come from the launcher.
    """
    info = get_cluster_info()
    owns_distributed = distributed is None
    dist = distributed or DistributedContext(
        rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1
    )
    exp_config = _resolve_config(config, info)
    run_path = resolve_run_dir(run_dir, info)
    storage_spec = checkpoint_storage if checkpoint_storage is not None else exp_config.checkpoint_storage
    storage = storage_from_spec(storage_spec, default_dir=run_path / "checkpoints")
    storage.check()  # a missing bucket or refused credentials: an error now, before training
    tracking = exp_config.integrations.mlflow is not None or exp_config.integrations.wandb is not None
    if tracking and dist.get_rank() == 0:
        check_trackers(exp_config, run_path)  # a missing package or an unanswering server: before any batch
    store = open_store(run_path)
    trial = info.trial if info is not None else _register_bare_trial(store, dist, exp_config)
    cluster_info = info or ClusterInfo(trial=trial, run_dir=str(run_path))
    if dist.get_rank() == 0:
        remove_stale_staging(storage)
        if isinstance(store, LocalStore):  # owners' pids mean something only on the store's machine
            recover_run_checkpoints(store, storage)  # every dead run's, not only this trial's

    def parts(trial: TrialInfo) -> dict[str, Any]:
        if dist.get_rank() == 0:  # settle what a killed writer of this trial left behind
            recover_checkpoints(store, storage, trial.trial_id)
        train = _build_train(store, trial, dist, tensorboard_mode, run_path, exp_config)
        recorder = _StoreRecorder(store, trial.trial_id, str(storage), before_record=train.flush_reports)
        return {
            "checkpoint": CheckpointContext(dist, storage, recorder=recorder),
            "train": train,
            "searcher": _build_searcher(store, trial, dist, exp_config, info, before_record=train.flush_reports),
            "profiler": ProfilerContext(dist, _profiler_reporter(store, trial.trial_id)),
        }

    context = Context(
        **parts(trial), distributed=dist, preempt=PreemptContext(dist, preempt_mode),
        info=cluster_info, store=store, owns_distributed=owns_distributed,
    )
    context._config_written = config is not None or info is not None
    context._tracking = (exp_config, run_path) if tracking else None
    if info is None:
        context._rebuild = lambda t: {**parts(t), "info": ClusterInfo(trial=t, run_dir=str(run_path))}
        continue_bare_run(context, latest_checkpoint)
    else:  # a launched trial (again, after a failure, pause or preemption): from its checkpoint, or from scratch
        resume_timeline(context, info.trial.steps_completed if info.latest_checkpoint else None)
    return context


def _resolve_config(config: ConfigSource | None, info: ClusterInfo | None) -> ExperimentConfig:
    if config is not None:
        return load_config(config)
    if info is not None:
        return load_config(info.trial.config)
    return load_config({"searcher": {"name": "single", "metric": "validation_loss", "max_length": 1}})


def _register_bare_trial(store: LocalStore, dist: DistributedContext, config: ExperimentConfig) -> TrialInfo:
    """The chief registers a one-trial experiment for a bare script; every rank gets the same trial."""
    payload: tuple[int, int, dict[str, Any], int] | None = None
    if dist.get_rank() == 0:
        seed = config.reproducibility.experiment_seed
        if seed is None:
            seed = random.SystemRandom().randrange(2**31)
        hparams = sample_hparams(config.hyperparameters, random.Random(seed))
        name = config.name if "name" in config.model_fields_set else Path(sys.argv[0] or "script").stem
        experiment_id = store.create_experiment(
            name=name, config=config.as_dict(), description=config.description, labels=list(config.labels)
        )
        trial_id = store.create_trial(experiment_id=experiment_id, hparams=hparams, seed=seed)
        claim_experiment(store, experiment_id)  # a kill -9 of this script is seen later as "resumable"
        payload = (experiment_id, trial_id, hparams, seed)
    if dist.get_size() > 1:
        payload = dist.broadcast(payload)
    assert payload is not None
    experiment_id, trial_id, hparams, seed = payload
    return TrialInfo(
        trial_id=trial_id, experiment_id=experiment_id, trial_seed=seed,
        hparams=hparams, config=config.as_dict(),
    )


def _build_train(
    store: LocalStore, trial: TrialInfo, dist: DistributedContext, mode: TensorboardMode,
    run_path: Path, config: ExperimentConfig,
) -> TrainContext:
    tb_dir = run_path / "tensorboard" / f"experiment_{trial.experiment_id}" / f"trial_{trial.trial_id}"
    return TrainContext(
        store=store, trial_id=trial.trial_id, experiment_id=trial.experiment_id, dist=dist,
        tensorboard_mode=mode, tensorboard_dir=tb_dir,
        searcher_metric=config.searcher.metric, smaller_is_better=config.searcher.smaller_is_better,
    )


def _build_searcher(
    store: LocalStore, trial: TrialInfo, dist: DistributedContext, config: ExperimentConfig,
    info: ClusterInfo | None, *, before_record: Callable[[], None],
) -> SearcherContext:
    max_length = config.searcher.max_length
    length = max_length.value if max_length is not None else 1
    units = Unit.from_name(max_length.unit) if max_length is not None else None
    lengths = info.searcher_lengths if info is not None and info.searcher_lengths else [length]
    return SearcherContext(
        dist, source=SingleOperationSource(*lengths), trial_id=trial.trial_id,
        store=store, units=units, max_length=max(length, *lengths), before_record=before_record,
    )


def _profiler_reporter(store: LocalStore, trial_id: int) -> Any:
    def report(group: str, steps: int, metrics: dict[str, Any]) -> None:
        store.add_metrics(trial_id=trial_id, group=group, steps_completed=steps, metrics=metrics)

    return report


class _StoreRecorder:
    """Records checkpoints of one trial in the store (what the cluster master would do)."""

    def __init__(self, store: LocalStore, trial_id: int, storage: str, before_record: Callable[[], None]) -> None:
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

