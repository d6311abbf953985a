"""TrainContext: reporting metrics, status, metadata and early exits to the local store (and TensorBoard)."""

from __future__ import annotations

import enum
import logging
import math
import numbers
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from determined_trials.core._metrics import (
    check_group_name,
    scalar_items,
    to_json_metrics,
)
from determined_trials.core.store import DisplayFields, HeldTime, ReportBuffer

if TYPE_CHECKING:
    from determined_trials.core._distributed import DistributedContext
    from determined_trials.core.store import TrialStore

__all__ = ["EarlyExitReason", "TensorboardMode", "TrainContext"]

logger = logging.getLogger("determined_trials.core")


class TensorboardMode(enum.Enum):
    """AUTO: the chief writes reported metrics as TensorBoard scalars. MANUAL: nothing is written."""

    AUTO = "AUTO"
    MANUAL = "MANUAL"


class EarlyExitReason(enum.Enum):
    """Why a trial ended before its searcher length."""

    INVALID_HP = "INVALID_HP"
    USER_REQUESTED_STOP = "USER_REQUESTED_STOP"


class TrainContext:
    """Reports a trial's metrics and state; every report lands in the run folder's store."""

    def __init__(
        self,
        *,
        store: TrialStore,
        trial_id: int,
        experiment_id: int,
        dist: DistributedContext,
        tensorboard_dir: Path,
        searcher_metric: str | None = None,
        smaller_is_better: bool = True,
    ) -> None:
        self._store = store
        self._trial_id = trial_id
        self._experiment_id = experiment_id
        self._dist = dist
        self._tensorboard_dir = tensorboard_dir
        self._searcher_metric = searcher_metric
        self._smaller_is_better = smaller_is_better
        self._display = DisplayFields(store, trial_id)
        self._time = HeldTime(store, trial_id)
        self._reports = ReportBuffer(store, trial_id, after_store=self._after_store)  # progress goes with batches
        self._keys_at_step: dict[str, tuple[int, set[str]]] = {}
        self._warned_non_finite: set[tuple[str, str]] = set()

    def report_training_metrics(
        self,
        steps_completed: int,
        metrics: dict[str, Any],
        batch_metrics: list[dict[str, Any]] | None = None,
    ) -> None:
        """Report training metrics at ``steps_completed`` (usually batches trained so far).

        Reports less than a second apart (of every group) are stored together, in one transaction:
        at the latest a second later (at the next report), and always before a checkpoint is
        recorded, before the experiment's best validation is read, before a searcher operation is
        recorded completed (``op.report_completed``), at the end of ``Trainer.fit`` and at exit
        (``flush_reports`` stores them on demand). Only a kill -9 or a power loss in that second can
        lose them (after the last checkpoint: a resume trains and reports them again)."""
        self._report("training", steps_completed, metrics, batch_metrics)

    def report_validation_metrics(self, steps_completed: int, metrics: dict[str, Any]) -> None:
        """Report validation metrics at ``steps_completed`` (stored as training reports are)."""
        self._report("validation", steps_completed, metrics, None)

    def report_metrics(self, group: str, steps_completed: int, metrics: dict[str, Any]) -> None:
        """Report metrics of any group ('training' and 'validation' are the built-in ones)."""
        check_group_name(group)
        self._report(group, steps_completed, metrics, None)

    def report_progress(self, progress: float) -> None:
        """Report the trial's progress as a fraction in [0, 1] (stored within a second, with the metrics reports
        held; 1.0 at once). The trainers report ``core._progress.trial_progress`` before each report."""
        if not 0.0 <= float(progress) <= 1.0:
            raise ValueError(f"progress must be a fraction between 0 and 1, got {progress!r}")
        self._display.set("progress", float(progress), now=float(progress) == 1.0)

    def set_status(self, status: str) -> None:
        """A short text saying what the trial is doing now (shown by ``det-trials trial list``;
        stored within a second, or at the next report after that)."""
        self._display.set("status", str(status))

    def set_metadata(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """Replace the trial's metadata (any JSON dict); returns what was stored."""
        converted = to_json_metrics(metadata, what="metadata")
        self._store.set_trial_metadata(self._trial_id, converted)
        return converted

    def get_metadata(self) -> dict[str, Any] | None:
        """The trial's metadata, or None when none was set."""
        return self._store.get_trial_metadata(self._trial_id) or None

    def get_tensorboard_path(self) -> Path:
        """The folder to write TensorBoard files to (the trial's own for the chief, per rank otherwise)."""
        if self._dist.get_rank() == 0:
            path = self._tensorboard_dir
        else:
            path = self._tensorboard_dir.parent / f"{self._tensorboard_dir.name}-rank{self._dist.get_rank()}-staging"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def upload_tensorboard_files(
        self,
        selector: Callable[[Path], bool] = lambda _: True,
        mangler: Callable[[Path, int], Path] = lambda path, rank: path,
    ) -> None:
        """Copy the selected files under ``get_tensorboard_path()`` into the trial's TensorBoard folder."""
        source = self.get_tensorboard_path()
        rank = self._dist.get_rank()
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            relative = path.relative_to(source)
            if not selector(relative):
                continue
            target = self._tensorboard_dir / mangler(relative, rank)
            if target.resolve() == path.resolve():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        """Record that the trial ends early (e.g. INVALID_HP); the experiment goes on."""
        if not isinstance(reason, EarlyExitReason):
            raise TypeError(f"reason must be an EarlyExitReason, got {reason!r}")
        self._store.set_trial_early_exit(self._trial_id, reason.value)

    def get_experiment_best_validation(self) -> float | None:
        """The best value of the searcher metric reported so far by any trial of the experiment."""
        if self._searcher_metric is None:
            return None
        self._reports.flush()  # this trial's held validations count too
        return self._store.best_validation(
            self._experiment_id, self._searcher_metric, self._smaller_is_better
        )

    def _resume_after(self, steps_completed: int | None) -> None:
        """Chief: this attempt goes on from the trial's checkpoint at ``steps_completed`` (None: from the
        start, without one). What lost attempts reported after it is superseded in the store (and dropped by
        TensorBoard: its sink rewinds), so that the trial shows one timeline."""
        self._reports.flush()
        marked = self._store.supersede_metrics_after(self._trial_id, steps_completed)
        if marked:
            where = "the start" if steps_completed is None else f"step {steps_completed}"
            logger.info("trial %d resumes from %s: %d metrics reports of a lost attempt after it are superseded",
                        self._trial_id, where, marked)

    def add_time(self, part: str, seconds: float) -> None:
        """Add ``seconds`` to the trial's time part ``part`` (one of ``core.store.TIME_PARTS``: where its wall time
        went); stored with the next store of reports and at close. The loop calls it at its boundaries (chief)."""
        self._time.add(part, seconds)

    def set_batches_reached(self, batches: int) -> None:
        """The trial has trained ``batches`` batches (a restart from an earlier checkpoint trains those after it
        again: the replay part); stored with the time parts."""
        self._time.reached(batches)

    def batches_reached(self) -> int:
        """The most batches any earlier attempt of the trial trained (stored)."""
        return self._store.batches_reached(self._trial_id)

    def _after_store(self) -> None:
        self._display.write()
        self._time.write()

    def flush_reports(self) -> None:
        """Store the reports still held back (see ``report_training_metrics``)."""
        self._reports.flush()

    def _flush_due_reports(self) -> None:
        """Store the reports held for ``HOLD_S`` or longer (a tracker's forwarder calls it, from its thread)."""
        self._reports.flush_due()

    def close(self) -> None:
        """Store the held-back reports, progress and status."""
        self._reports.flush()
        self._display.write()
        self._time.write()

    def _report(
        self,
        group: str,
        steps_completed: int,
        metrics: dict[str, Any],
        batch_metrics: list[dict[str, Any]] | None,
    ) -> None:
        steps = _check_steps(steps_completed)
        converted = to_json_metrics(metrics, what=f"{group} metrics")
        batches = None
        if batch_metrics is not None:
            batches = [to_json_metrics(m, what=f"batch_metrics[{i}]") for i, m in enumerate(batch_metrics)]
        self._check_no_overlap(group, steps, converted)
        self._warn_non_finite(group, steps, converted)
        self._reports.add({"group": group, "steps_completed": steps, "metrics": converted,
                           "batch_metrics": batches, "reported_time": time.time()})
        self._display.write_if_due()
        logger.debug("reported %s metrics at step %d: %s", group, steps, converted)

    def _warn_non_finite(self, group: str, steps: int, metrics: dict[str, Any]) -> None:
        """NaN/inf metrics are stored (they are what happened), with one warning per metric name."""
        for key, value in scalar_items(metrics):
            if not math.isfinite(value) and (group, key) not in self._warned_non_finite:
                self._warned_non_finite.add((group, key))
                logger.warning("%s metric %r is %s at step %d (warned once per metric; a NaN searcher metric "
                               "never counts as the best)", group, key, value, steps)

    def _check_no_overlap(self, group: str, steps: int, metrics: dict[str, Any]) -> None:
        last_steps, keys = self._keys_at_step.get(group, (-1, set()))
        if last_steps != steps:
            keys = set()
        overlap = keys & metrics.keys()
        if overlap:
            raise ValueError(
                f"{group} metrics {sorted(overlap)} were already reported at steps_completed={steps}; "
                "report each key once per step (or use a different steps_completed)"
            )
        self._keys_at_step[group] = (steps, keys | metrics.keys())


def _check_steps(steps_completed: Any) -> int:
    if isinstance(steps_completed, bool) or not isinstance(steps_completed, numbers.Integral) or steps_completed < 0:
        raise TypeError(f"steps_completed must be a non-negative int, got {steps_completed!r}")
    return int(steps_completed)
