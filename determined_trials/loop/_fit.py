"""The one ``fit`` front every family's ``Trainer`` shares: the arguments and their checks, the config a
plain script runs with, the body of every ``init()``, resume resolution (``"latest"``), Ctrl-C, the exit
reason and the retention policy after a plain run that ended (completed or stopped by the trial). A family
gives only its adapter."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from determined_trials import core
from determined_trials._info import get_cluster_info
from determined_trials.config import ExperimentConfig, default_searcher, load_config
from determined_trials.core.store import collect_bare_trial_garbage
from determined_trials.loop._adapter import TrialAdapter
from determined_trials.loop._controller import Controller, ExitReason, LoopSettings
from determined_trials.loop._hooks import HookRunner
from determined_trials.loop._resume import interrupt_stops_training, resolve_resume
from determined_trials.loop._units import Batch, TrainUnit

if TYPE_CHECKING:
    from determined_trials.config import SearcherConfig

__all__ = ["TrainerFront", "experiment_config", "open_trial_context"]

DEFAULT_REPORTING_PERIOD = Batch(100)
_ENDED = (ExitReason.COMPLETED, ExitReason.STOPPED)
"""Exits that end the trial, after which a plain run applies the retention policy. A PREEMPTED run is
resumable and keeps everything: ``fit(latest_checkpoint="latest")`` continues the same trial, whose
checkpoints (the preempted part's too) are collected when it ends."""


class _ClosableContext(Protocol):
    def _close(self) -> None: ...


_C = TypeVar("_C", bound=_ClosableContext)


def experiment_config(exp_conf: Any, hparams: Mapping[str, Any] | None) -> tuple[ExperimentConfig | None, bool]:
    """The config an ``init()`` runs with (``exp_conf``, else one holding ``hparams`` as constants, else None:
    the launcher's) and whether its ``searcher`` (hence ``searcher.metric``) was written by the user: one
    the user did not write never enforces its metric."""
    if exp_conf is not None:
        if isinstance(exp_conf, Mapping) and not exp_conf.get("searcher"):
            return load_config({**exp_conf, "searcher": default_searcher()}), False
        return load_config(exp_conf), True
    if hparams is not None:
        return load_config({"hyperparameters": dict(hparams), "searcher": default_searcher()}), False
    return None, True


@contextlib.contextmanager
def open_trial_context(
    make_context: Callable[[core.Context], _C],
    config: ExperimentConfig | None,
    distributed: core.DistributedContext | None,
    from_environment: Callable[[], core.DistributedContext | None],
    run_dir: str | os.PathLike[str] | None,
    seed: Callable[[int], None],
) -> Iterator[_C]:
    """The body of every ``init()``: the Core API context (with ``distributed``, else the one
    ``from_environment`` gives, closed at the end), RNGs seeded from the trial seed, then
    ``make_context(core)``, closed on the way out. In a plain script the trial is settled later, by
    ``fit`` (resuming an earlier trial, or this run's own) or by the first use of what is bound to it."""
    opened_at = time.time()  # the trial's build part begins (the time parts: loop/_time_parts)
    dist = distributed or from_environment()
    with contextlib.ExitStack() as owned:
        if distributed is None and dist is not None:
            owned.callback(dist.close)  # ours (from the environment): close it, or the next init collides
        core_context = owned.enter_context(core.init(distributed=dist, config=config, run_dir=run_dir))
        core_context.opened_at = opened_at
        seed(core_context.peek_trial().trial_seed)  # fit may still settle the trial as an earlier one
        context = make_context(core_context)
        try:
            yield context
        finally:
            context._close()


class TrainerFront:
    """``Trainer(trial, context).fit(...)`` for every family. A family's ``Trainer`` sets the class
    attributes and ``_make_hooks_and_adapter``; the loop, its settings and everything around it live here."""

    _family: ClassVar[str]
    """The family's module under ``det``: ``pytorch``, ``deepspeed``, ``keras`` (for messages)."""
    _context_class: ClassVar[type]

    @staticmethod
    def _check_trial_class(trial_class: type, /) -> None:
        """Reject what is not a complete trial class of the family, saying why."""
        raise NotImplementedError

    def __init__(self, trial: Any, context: Any) -> None:
        self._check_trial_class(type(trial))
        if not isinstance(context, self._context_class) or getattr(context, "_core", None) is None:
            raise TypeError(f"det.{self._family}.Trainer needs the context from "
                            f"`with det.{self._family}.init() as context:`")
        self._trial: Any = trial
        self._context: Any = context
        self.exit_reason: ExitReason | None = None

    def fit(
        self,
        checkpoint_period: TrainUnit | None = None,
        validation_period: TrainUnit | None = None,
        max_length: TrainUnit | None = None,
        reporting_period: TrainUnit | None = DEFAULT_REPORTING_PERIOD,
        checkpoint_policy: str = "best",
        latest_checkpoint: str | None = None,
        step_zero_validation: bool = False,
        test_mode: bool = False,
        profiling_enabled: bool = False,
        *,
        show_progress: bool | None = None,
    ) -> None:
        """Train until ``max_length`` (or, when it is None, each searcher operation of the config),
        validating and checkpointing at the given periods, and resuming from ``latest_checkpoint``.

        A preemption (SIGTERM/SIGUSR1, or a first Ctrl-C) or ``context.set_stop_requested(True)``
        ends training after the current batch, with a checkpoint; ``self.exit_reason`` says which.
        ``latest_checkpoint="latest"`` resumes the newest checkpoint of an earlier run (continuing
        its trial); in a plain script a Ctrl-C stop then raises ``det.errors.TrainingInterrupted``
        (exit status 75). A second Ctrl-C aborts at once.
        """
        core_context: core.Context = self._context._core
        searcher = self._context.config.searcher
        settings = LoopSettings(
            max_length=max_length, validation_period=validation_period, checkpoint_period=checkpoint_period,
            reporting_period=reporting_period, checkpoint_policy=checkpoint_policy,
            step_zero_validation=step_zero_validation, test_mode=test_mode, profiling_enabled=profiling_enabled,
            show_progress=show_progress, searcher_metric=self._searcher_metric(searcher),
            smaller_is_better=searcher.smaller_is_better,
        )
        latest_checkpoint = resolve_resume(core_context, latest_checkpoint)  # settles the context's trial
        hooks, adapter = self._make_hooks_and_adapter()
        controller = Controller(core=core_context, adapter=adapter, hooks=hooks, settings=settings)
        with interrupt_stops_training(core_context) as exits:
            try:
                self.exit_reason = controller.run(latest_checkpoint)
            except RuntimeError as exc:
                self._explain_failure(exc, core_context.distributed)
                raise
            exits.append(self.exit_reason)
        if self.exit_reason in _ENDED and checkpoint_policy == "all" and get_cluster_info() is None:
            collect_bare_trial_garbage(core_context, self._context.config)

    def _searcher_metric(self, searcher: SearcherConfig) -> str | None:
        """The validation metric the loop ranks checkpoints by: the config's, when the user named one."""
        return searcher.metric if self._context._searcher_metric_named else None

    def _make_hooks_and_adapter(self) -> tuple[HookRunner, TrialAdapter]:
        """The hooks (user callbacks first) and the loop's adapter for this trainer's trial."""
        raise NotImplementedError

    def _explain_failure(self, exc: RuntimeError, dist: core.DistributedContext) -> None:
        """Given a failure of the loop, raise a clearer error in its place where the family knows one."""
