"""The one training loop: ask the schedule for the next boundary, have the adapter train that many
batches, then report, validate and checkpoint in a fixed order. Stops (preemption, stop requests)
are honoured after the batch where they arrive, with a checkpoint.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from determined_trials.core import read_json_file, trial_progress
from determined_trials.loop._adapter import DataShape, StopCheck, TrialAdapter
from determined_trials.loop._checkpointing import CHECKPOINT_FORMAT, TRIAL_STATE_FILE, Checkpointer
from determined_trials.loop._clock import Clock
from determined_trials.loop._hooks import HookRunner
from determined_trials.loop._progress import Progress, progress_enabled, summary_line
from determined_trials.loop._schedule import Boundary, Schedule
from determined_trials.loop._time_parts import TrialTimer
from determined_trials.loop._units import TrainUnit, unit_from_length

if TYPE_CHECKING:
    from determined_trials.core import Context, SearcherOperation

__all__ = ["CHECKPOINT_FORMAT", "TRIAL_STATE_FILE", "Controller", "ExitReason", "LoopSettings"]

logger = logging.getLogger("determined_trials.loop")

_POLICIES = ("best", "all", "none")


class ExitReason(enum.Enum):
    """How ``run`` ended: trained to the end, preempted (resumable), or stopped by the trial."""

    COMPLETED = "completed"
    PREEMPTED = "preempted"
    STOPPED = "stopped"


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """Everything the loop needs from ``Trainer.fit`` (or the harness), parsed once."""

    max_length: TrainUnit | None
    validation_period: TrainUnit | None = None
    checkpoint_period: TrainUnit | None = None
    reporting_period: TrainUnit | None = None
    checkpoint_policy: str = "best"
    step_zero_validation: bool = False
    test_mode: bool = False
    profiling_enabled: bool = False
    show_progress: bool | None = None
    summaries: bool = True
    searcher_metric: str | None = None
    smaller_is_better: bool = True

    def __post_init__(self) -> None:
        if self.checkpoint_policy not in _POLICIES:
            raise ValueError(f"checkpoint_policy must be one of {list(_POLICIES)}, got {self.checkpoint_policy!r}")
        for name in ("max_length", "validation_period", "checkpoint_period", "reporting_period"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, TrainUnit):
                raise TypeError(f"{name} must be Batch(...), Epoch(...) or Record(...), got {value!r}")
        if self.max_length is not None and not self.max_length.is_period:
            raise ValueError(f"max_length must be a single length, got the schedule {self.max_length!r}")


@dataclasses.dataclass(frozen=True)
class _Target:
    batches: int  # train to this batch
    full: int  # the most the trial trains, in batches: its progress is batches trained / full
    op: SearcherOperation | None = None


class Controller:
    """Drives one trial through an adapter under a Core API context."""

    def __init__(self, *, core: Context, adapter: TrialAdapter, hooks: HookRunner, settings: LoopSettings) -> None:
        self._core = core
        self._adapter = adapter
        self._hooks = hooks
        self._settings = settings
        self._dist = core.distributed
        self._is_chief = self._dist.get_rank() == 0
        self._state = Clock(hooks, trial_id=core.info.trial.trial_id)  # the trial's clock: counters, epochs, position
        self._exit: ExitReason | None = None
        self._last_validation: dict[str, Any] = {}
        self._progress: Progress | None = None
        self._checkpointer = Checkpointer(core=core, adapter=adapter, hooks=hooks)
        self._final_batch: int | None = None  # with max_length: nothing trains after this batch
        self._timer = TrialTimer(core, chief=self._is_chief)  # where the trial's time goes, at the boundaries

    def run(self, latest_checkpoint: str | None = None) -> ExitReason:
        """Train until the length is reached, the trial is preempted or it asks to stop."""
        try:
            self._startup(latest_checkpoint)
            shape = self._adapter.start_training(self._state)
            self._state.start(shape.epoch_len)
            self._hooks.call("on_training_start")
            if self._settings.profiling_enabled:
                self._core.profiler.on()
            self._timer.training_starts()
            reason = self._train(shape)
            with self._timer.held("checkpoint"):
                self._checkpointer.wait()  # the last checkpoint is stored (and its hook fired) before run returns
            return reason
        finally:
            self._shutdown()

    # -- start and end -------------------------------------------------------------------------

    def _startup(self, latest_checkpoint: str | None) -> None:
        if latest_checkpoint is None:
            self._hooks.call("on_trial_startup", 0, None)
            warm = self._core.info.warm_start_checkpoint
            if warm is not None:  # searcher.source_trial_id / source_checkpoint_uuid: weights only, counters at 0
                with self._core.checkpoint.restore_path(warm) as path:
                    self._adapter.load_weights(path)
                logger.info("warm start: the model weights of checkpoint %s", warm)
            return
        with self._timer.restoring(), self._core.checkpoint.restore_path(latest_checkpoint) as path:
            self._state.load_state_dict(_read_trial_state(path, latest_checkpoint))
            self._state.trial_id = self._core.info.trial.trial_id
            self._hooks.call("on_trial_startup", self._state.batches_trained, latest_checkpoint)
            self._adapter.load(path)
        logger.info("resumed from checkpoint %s after %d batches", latest_checkpoint, self._state.batches_trained)

    def _shutdown(self) -> None:
        try:
            self._checkpointer.close()
            self._core.train.flush_reports()  # what the run reported is in the store when it returns
            if self._settings.profiling_enabled:
                self._core.profiler.off()
            if self._progress is not None:
                self._progress.close()
            self._adapter.close()
        finally:
            self._hooks.call("on_trial_shutdown")

    # -- the loop ------------------------------------------------------------------------------

    def _train(self, shape: DataShape) -> ExitReason:
        schedule = self._schedule(shape)
        self._progress = self._make_progress(shape)
        if self._settings.step_zero_validation and self._state.batches_trained == 0:
            self._validate()
        if self._validation_owed(schedule):
            self._validate()  # the run stopped at a validation boundary before validating: do it now
        if self._settings.max_length is not None:
            self._final_batch = self._to_batches(self._settings.max_length, shape)
        for target in self._targets(shape):
            self._progress.set_total(target.batches)
            while self._state.batches_trained < target.batches:
                if self._workload(schedule, target):
                    return self._exit_early()
                if self._settings.test_mode:
                    break
            if target.op is not None:
                self._complete_operation(target.op)
            if self._settings.test_mode:
                break
        if self._state.last_validation != self._state.batches_trained:
            self._validate()
        self._checkpoint_if_needed(final=True)
        if self._settings.max_length is not None and not self._settings.test_mode:
            self._complete_reached_operations(shape)
        return ExitReason.COMPLETED

    def _workload(self, schedule: Schedule, target: _Target) -> bool:
        """Train to the next boundary and process it; True when the trial must stop now."""
        state = self._state
        if self._settings.test_mode:
            end = state.batches_trained + 1
        else:
            end = schedule.next_boundary(state.batches_trained, target.batches)
        began, first = time.perf_counter(), state.batches_trained
        try:
            self._adapter.train(end - first, state, self._stop_check())
            fired = schedule.fired(state.batches_trained, target.batches)
            self._end_workload(target.full)
        finally:  # a failed workload's batches count too: a restart trains them again (replay)
            self._timer.trained(time.perf_counter() - began, first, state.batches_trained,
                                self._adapter.take_data_wait())
        if self._exit is not None:
            return True
        # the run's (or the operation's) end always validates: before a checkpoint taken there, as at any boundary
        at_end = state.batches_trained >= target.batches
        validates = Boundary.VALIDATE in fired or (Boundary.CHECKPOINT in fired and at_end)
        if validates and state.last_validation != state.batches_trained:
            self._validate()
            if self._should_stop():  # a stop asked for while validating (e.g. early stopping) is honoured now
                return True
        if Boundary.CHECKPOINT in fired:
            self._checkpoint_if_needed()
        return False

    def _validation_owed(self, schedule: Schedule) -> bool:
        """After a resume: whether the schedule validates at the current batch and it was not done."""
        state, rule = self._state, schedule.validation
        trained = state.batches_trained
        return trained > 0 and rule is not None and rule.fires(trained) and state.last_validation != trained

    def _stop_check(self) -> StopCheck:
        """The per-batch stop check for the adapter: on one process two flag reads, the full decision
        (``_should_stop``) only once one is set; with several ranks the agreed decision every batch."""
        preempt, adapter_stop = self._core.preempt, self._adapter.stop_requested
        if not preempt.decides_locally:
            return StopCheck(self._should_stop)

        def check() -> bool:
            return (preempt.signalled or adapter_stop()) and self._should_stop()

        return StopCheck(check, local_preempt=preempt)

    def _should_stop(self) -> bool:
        preempt, stop = self._core.preempt.check(stop_requested=self._adapter.stop_requested())
        if preempt:
            self._exit = ExitReason.PREEMPTED
        elif stop:
            self._exit = ExitReason.STOPPED
        return preempt or stop

    def _exit_early(self) -> ExitReason:
        assert self._exit is not None
        logger.info("%s after batch %d: checkpointing and exiting", self._exit.value, self._state.batches_trained)
        self._checkpoint_if_needed(final=True)
        return self._exit

    def _targets(self, shape: DataShape) -> Iterator[_Target]:
        """Absolute batch counts to train to: ``max_length``, or each searcher operation's length."""
        if self._settings.max_length is not None:
            batches = self._to_batches(self._settings.max_length, shape)
            yield _Target(batches, batches)
            return
        if self._settings.searcher_metric is None:
            raise ValueError("fit() needs max_length (e.g. max_length=Epoch(1)) when the config names no "
                             "searcher.metric: without one there are no searcher operations to train through")
        units = self._core.searcher.get_configured_units()
        for op in self._core.searcher.operations():
            length = unit_from_length(op.length, units.name.lower() if units else None)
            full = unit_from_length(op.max_length, units.name.lower() if units else None)
            yield _Target(self._to_batches(length, shape), self._to_batches(full, shape), op)

    # -- boundaries ----------------------------------------------------------------------------

    def _end_workload(self, full_batches: int) -> None:
        state = self._state
        metrics = self._adapter.training_metrics()
        self._checkpointer.poll()  # a background write that finished fires its hook now
        self._hooks.call("on_training_workload_end", metrics, self._adapter.batch_metrics())
        if self._is_chief:
            reported = {"batches": state.batches_trained, "epochs": state.epochs_trained, **metrics}
            # progress first: it is stored with the report of the same batches (TrainContext._report)
            self._core.train.report_progress(trial_progress(state.batches_trained, full_batches))
            self._core.train.report_training_metrics(steps_completed=state.batches_trained, metrics=reported)
            assert self._progress is not None
            self._progress.advance_to(state.batches_trained)
            self._progress.say(summary_line("training", state.batches_trained, state.epochs_trained, metrics))

    def _validate(self) -> None:
        with self._timer.held("validation"):
            take_checkpoint = self._validate_and_report()
        if take_checkpoint:
            self._checkpoint_if_needed()

    def _validate_and_report(self) -> bool:
        """Validate, report, and say whether the checkpoint policy wants a checkpoint now."""
        state = self._state
        if self._is_chief:
            self._core.train.set_status("validating")
        self._hooks.call("on_validation_start")
        metrics = self._adapter.validate(test_mode=self._settings.test_mode)
        self._check_searcher_metric(metrics)
        self._hooks.call("on_validation_end", metrics)
        state.last_validation = state.batches_trained
        self._last_validation = metrics
        take_checkpoint = False
        if self._is_chief:
            take_checkpoint = self._policy_wants_checkpoint(metrics)
            reported = {"batches": state.batches_trained, "epochs": state.epochs_trained, **metrics}
            self._core.train.report_validation_metrics(steps_completed=state.batches_trained, metrics=reported)
            assert self._progress is not None
            self._progress.say(summary_line("validation", state.batches_trained, state.epochs_trained, metrics))
            self._core.train.set_status("training")
        if self._dist.get_size() > 1:
            take_checkpoint = bool(self._dist.broadcast(take_checkpoint))
        return take_checkpoint

    def _check_searcher_metric(self, metrics: dict[str, Any]) -> None:
        """At every validation, whatever the checkpoint policy: a metric the user's config names must be
        among those the trial returns (as in Determined). A searcher the user did not write (a plain
        script's ``init()`` without one) has no metric here, so nothing is enforced."""
        metric = self._settings.searcher_metric
        if metric is not None and metric not in metrics:
            raise KeyError(_missing_metric_message(metric, metrics))

    def _policy_wants_checkpoint(self, metrics: dict[str, Any]) -> bool:
        policy = self._settings.checkpoint_policy
        if policy == "best" and self._settings.searcher_metric is None:
            return True  # no metric to rank by: "best" keeps every validated checkpoint, as "all"
        if policy != "best":
            return policy == "all"
        value = _searcher_value(metrics, self._settings.searcher_metric)
        if math.isnan(value):
            return False  # NaN is never the best
        best = self._core.train.get_experiment_best_validation()
        if best is None:
            return True
        return value < best if self._settings.smaller_is_better else value > best

    def _checkpoint_if_needed(self, *, final: bool = False) -> None:
        state = self._state
        if state.last_checkpoint == state.batches_trained and state.batches_trained > 0:
            return
        state.last_checkpoint = state.batches_trained
        final = final or (self._final_batch is not None and state.batches_trained >= self._final_batch)
        with self._timer.held("checkpoint"):
            self._checkpointer.save(state, final=final)

    def _complete_reached_operations(self, shape: DataShape) -> None:
        """``fit(max_length=...)`` under a searcher: the operations the run trained through are
        completed with the last validation's searcher metric (Determined's searcher reads that)."""
        metric = self._settings.searcher_metric
        if metric is None or metric not in self._last_validation:
            return
        units = self._core.searcher.get_configured_units()
        operations = self._core.searcher.operations()
        for op in operations:
            length = unit_from_length(op.length, units.name.lower() if units else None)
            if self._to_batches(length, shape) > self._state.batches_trained:
                break
            if self._is_chief:
                op.report_completed(_searcher_value(self._last_validation, metric))
        if isinstance(operations, Generator):
            operations.close()  # an operation not reached stays open for the searcher

    def _complete_operation(self, op: SearcherOperation) -> None:
        if self._state.last_validation != self._state.batches_trained:
            self._validate()
        if self._is_chief:
            op.report_completed(_searcher_value(self._last_validation, self._settings.searcher_metric))
        self._state.searcher_ops_completed += 1

    # -- helpers -------------------------------------------------------------------------------

    def _schedule(self, shape: DataShape) -> Schedule:
        def rule(unit: TrainUnit | None) -> Any:
            if unit is None:
                return None
            return unit.to_batch_rule(epoch_len=shape.epoch_len, global_batch_size=shape.global_batch_size)

        s = self._settings
        return Schedule(reporting=rule(s.reporting_period), validation=rule(s.validation_period),
                        checkpoint=rule(s.checkpoint_period))

    def _to_batches(self, unit: TrainUnit, shape: DataShape) -> int:
        return unit.to_batches(epoch_len=shape.epoch_len, global_batch_size=shape.global_batch_size)

    def _make_progress(self, shape: DataShape) -> Progress:
        enabled = progress_enabled(self._settings.show_progress, self._is_chief)
        total = self._to_batches(self._settings.max_length, shape) if self._settings.max_length else None
        return Progress(enabled=enabled, summaries=self._is_chief and self._settings.summaries,
                        total=total, initial=self._state.batches_trained)


def _missing_metric_message(metric: str, metrics: dict[str, Any]) -> str:
    """Determined's words for a searcher metric the trial does not return, and the two fixes."""
    return (
        f"Search method is configured to use metric {metric!r} but model definition returned validation "
        f"metrics {sorted(metrics)}. The metric used by the search method must be one of the validation "
        "metrics returned by the model definition: return it from evaluate_batch/evaluate_full_dataset "
        "or change searcher.metric"
    )


def _searcher_value(metrics: dict[str, Any], metric: str | None) -> float:
    if metric is None:
        raise ValueError("checkpoint_policy='best' and searcher operations need searcher.metric in the config")
    if metric not in metrics:
        raise KeyError(_missing_metric_message(metric, metrics))
    value = metrics[metric]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"the searcher metric {metric!r} must be a number, got {value!r}")
    return float(value)


def _read_trial_state(path: Path, storage_id: str) -> dict[str, Any]:
    return read_json_file(path / TRIAL_STATE_FILE, (
        f"checkpoint {storage_id} has no {TRIAL_STATE_FILE}: it was not written by a det-trials "
        "Trainer; load its weights in your trial's __init__ instead of passing latest_checkpoint"
    ))
