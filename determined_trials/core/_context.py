"""``core.init()`` and ``Context``: wire the Core API contexts to the run folder and tear them down.

``init`` resolves the configuration, the run folder and the trial (from the launcher's cluster info,
or registering a new experiment and trial for a bare script); the contexts bound to the trial are built
once it is settled (``_parts``). Entering the ``Context`` starts what runs in the background; leaving it
stops everything, also on errors.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from determined_trials._info import ClusterInfo, TrialInfo, get_cluster_info
from determined_trials.config import ExperimentConfig, load_config, sample_hparams
from determined_trials.core._checkpoint import CheckpointContext
from determined_trials.core._distributed import DistributedContext
from determined_trials.core._parts import PartsMaker, TrialParts
from determined_trials.core._preempt import PreemptContext, PreemptMode
from determined_trials.core._profiler import ProfilerContext
from determined_trials.core._resume import continue_bare_run, resume_timeline
from determined_trials.core._searcher import SearcherContext
from determined_trials.core._train import EarlyExitReason, TensorboardMode, TrainContext
from determined_trials.core.channel import open_store, own_store
from determined_trials.core.storage import storage_from_spec
from determined_trials.core.store import (
    LocalStore,
    RunState,
    TrialStore,
    claim_experiment,
    recover_run_checkpoints,
    remove_stale_staging,
)
from determined_trials.core.trackers import (
    Outcome,
    TrackerForwarder,
    TrackerHelper,
    check_trackers,
    open_forwarder,
    start_tracker_helper,
)
from determined_trials.errors import InvalidHP, TrainingInterrupted

__all__ = ["DEFAULT_RUN_DIR", "RUN_DIR_ENV", "Context", "init", "resolve_run_dir"]

logger = logging.getLogger("determined_trials.core")

RUN_DIR_ENV = "DET_RUN_DIR"
LAUNCH_DIR_ENV = "DET_LAUNCH_DIR"
PREEMPTED_MARKER = "preempted"
DEFAULT_RUN_DIR = "det-runs"
_FIRST_PASS_TIMEOUT_S = 60.0
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
    ``.profiler`` and ``.info``. Build it with ``det.core.init()``, use it in a ``with`` block.

    Its trial is settled once: under a launcher, or when ``init`` resumed a checkpoint, at construction; in a
    plain script otherwise when a trainer's ``fit`` resolves what it resumes, or at the first use of ``.info`` or
    of a part bound to the trial (``.train``, ``.checkpoint``, ``.searcher``, ``.profiler``), which are built
    then, with the tracker runs of the trial."""

    def __init__(
        self,
        *,
        distributed: DistributedContext,
        preempt: PreemptContext,
        store: TrialStore,
        info: ClusterInfo,
        settled: bool,
        make_parts: PartsMaker,
        tracking: tuple[ExperimentConfig, Path] | None = None,
        config_written: bool = True,
        owns_distributed: bool = False,
    ) -> None:
        self.distributed = distributed
        self.preempt = preempt
        self.store = store
        self._registered = info  # the trial init() was given or registered
        self._info: ClusterInfo | None = info if settled else None
        self._make_parts = make_parts
        self._parts: TrialParts | None = None
        self._owns_distributed = owns_distributed
        self._entered = False
        self._closed = False
        self._config_written = config_written  # False when init() made up the config (no config, no launcher)
        self._tracking = tracking  # the config naming trackers, the run folder
        self._trackers: TrackerHelper | TrackerForwarder | None = None
        self._restart_step: int | None = None  # the first step this process trains, once the timeline says
        self._ending = Outcome.PAUSED  # until __exit__ says how the trial ended
        self.opened_at = time.time()  # when building the trial began (a trainer's init() sets it before core.init)

    @property
    def info(self) -> ClusterInfo:
        """The task facts and the trial this context reports to (reading them settles the trial)."""
        if self._info is None:
            self._info = self._registered
        return self._info

    @property
    def checkpoint(self) -> CheckpointContext:
        """Stores and restores the trial's checkpoints."""
        return self._trial_parts().checkpoint

    @property
    def train(self) -> TrainContext:
        """Reports the trial's metrics, progress and status."""
        return self._trial_parts().train

    @property
    def searcher(self) -> SearcherContext:
        """The trial's searcher operations."""
        return self._trial_parts().searcher

    @property
    def profiler(self) -> ProfilerContext:
        """The trial's system-metrics profiler."""
        return self._trial_parts().profiler

    def peek_trial(self) -> TrialInfo:
        """The trial as far as it is known, without settling it: before a plain script's ``fit`` resumes, the
        trial ``init`` registered, whose hyperparameters, config and seed (the seed the process's RNGs start
        from) are this run's; its ids and seed of record give way to an earlier trial's if ``fit`` continues it."""
        return (self._info or self._registered).trial

    def _settle(self, trial: TrialInfo, latest_checkpoint: str | None) -> None:
        """Fix the trial this context reports to and the checkpoint it resumes from; the trial is fixed once
        (settling it again with another trial is an error)."""
        if self._info is not None and self._info.trial != trial:
            raise RuntimeError(f"this context reports to trial {self._info.trial.trial_id}; it cannot be settled "
                               f"again as trial {trial.trial_id}")
        base = self._info or self._registered
        self._info = dataclasses.replace(base, trial=trial, latest_checkpoint=latest_checkpoint)

    @property
    def _trial_settled(self) -> bool:
        return self._info is not None

    def _built_parts(self) -> TrialParts:
        """The parts bound to the settled trial, built on first use."""
        if self._parts is None:
            self._parts = self._make_parts(self.info.trial)
        return self._parts

    def _trial_parts(self) -> TrialParts:
        """The parts bound to the settled trial, with its tracker runs started once the context is entered."""
        parts = self._built_parts()
        if self._entered and not self._closed and self._trackers is None:
            self._trackers = self._start_trackers()
        return parts

    def _restart_timeline(self, steps_completed: int | None) -> None:
        """Chief: this process goes on from the trial's checkpoint at ``steps_completed`` (None: from the start).
        The store supersedes what lost attempts reported after it before the tracker runs start sending (started
        again if they run: TensorBoard drops its points from the restart's step)."""
        running = self._trackers is not None
        if self._trackers is not None:
            self._trackers.finish(Outcome.PAUSED)
            self._trackers = None
        self._restart_step = 0 if steps_completed is None else steps_completed + 1
        self._built_parts().train._resume_after(steps_completed)
        if running:
            self._trackers = self._start_trackers()

    def __enter__(self) -> Context:
        self.preempt.start()
        self._entered = True
        if self._parts is not None:
            self._trackers = self._start_trackers()
        return self

    def _start_trackers(self) -> TrackerHelper | TrackerForwarder | None:
        """The chief's sender of this trial's tracker runs (once the trial is settled and in use): a helper
        process for MLflow and W&B (TensorBoard with them), else a thread for TensorBoard alone."""
        if self.distributed.get_rank() != 0 or self._parts is None:
            return None
        facts = self._make_parts.tracker_facts(self.info.trial, self._restart_step)
        flush_due = self._parts.train._flush_due_reports
        if self._tracking is not None:
            return start_tracker_helper(facts, self._tracking[0], flush_due)
        if facts.tensorboard_dir is None:
            return None
        forwarder = open_forwarder(self.store, facts, self._make_parts.config.integrations, before_pass=flush_due)
        if forwarder is not None and not facts.first_process:  # the restart marker before the trial's own events
            forwarder.first_pass.wait(_FIRST_PASS_TIMEOUT_S)
        return forwarder

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
        if self._parts is not None:
            self._parts.profiler.off()
            self._parts.train.close()
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
            own_store(self.store).set_experiment_state(self.info.trial.experiment_id, state, reason)


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
    trial = info.trial if info is not None else _register_bare_trial(own_store(store), dist, exp_config)
    cluster_info = info or ClusterInfo(trial=trial, run_dir=str(run_path))
    if dist.get_rank() == 0:
        remove_stale_staging(storage)
        if isinstance(store, LocalStore):  # owners' pids mean something only on the store's machine
            recover_run_checkpoints(store, storage)  # every dead run's, not only this trial's

    context = Context(
        distributed=dist, preempt=PreemptContext(dist, preempt_mode), store=store, info=cluster_info,
        settled=info is not None, owns_distributed=owns_distributed,
        make_parts=PartsMaker(store, storage, dist, tensorboard_mode, run_path, exp_config, info),
        tracking=(exp_config, run_path) if tracking else None, config_written=config is not None or info is not None,
    )
    if info is None:  # a plain script: resuming a checkpoint settles its trial now, else its first use does
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
