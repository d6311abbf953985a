"""What the forwarder asks of a tracker client, and how a trial's ending reads to each tracker."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from determined_trials._info import TrialInfo
from determined_trials.core.store import CheckpointRecord, MetricRecord

__all__ = ["Outcome", "Sink", "TrialFacts", "flat_params", "step_values"]


@dataclasses.dataclass(frozen=True)
class TrialFacts:
    """What a tracker run records of its trial: the trial, its experiment's name and searcher metric, the run folder."""

    trial: TrialInfo
    experiment_name: str
    searcher_metric: str | None
    run_dir: str
    parent_runs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Tracker name -> the run id of the trial this one was forked from (``det-trials trial fork``)."""
    tensorboard_dir: str | None = None
    """The trial's TensorBoard folder, when its metrics go to TensorBoard (``TensorboardMode.AUTO``)."""
    restart_step: int | None = None
    """The first step this process of the trial trains (0 from scratch, k + 1 from the checkpoint at k); None when
    the sender is not the trial's process (the runner's last word)."""

    @property
    def first_process(self) -> bool:
        """No process of the trial ran before this one (its first attempt, from scratch): nothing to rewind."""
        return self.restart_step == 0 and self.trial.trial_run_id == 1

    @property
    def run_name(self) -> str:
        return f"{self.experiment_name} trial {self.trial.trial_id}"

    @property
    def params(self) -> dict[str, str]:
        """The run's params: hyperparameters flattened with dots, and the seed."""
        return flat_params(self.trial.hparams, self.trial.trial_seed)


class Outcome(enum.Enum):
    """How the trial process ended: (ended for good, MLflow run status, W&B exit code)."""

    COMPLETED = (True, "FINISHED", 0)
    FAILED = (False, "FAILED", 1)
    PAUSED = (False, "SCHEDULED", 0)  # preempted or paused: the next attempt resumes the run (RUNNING again)
    KILLED = (False, "KILLED", 255)  # stopped by Ctrl-C or a kill; "latest" may still resume it
    GAVE_UP = (True, "FAILED", 1)  # the runner restarts the failed trial no more: its last reports are final
    CANCELED = (True, "KILLED", 255)  # the runner stopped the trial for good (the experiment was killed)

    @property
    def ended(self) -> bool:
        """Whether every metric row is final (no restart will supersede any of them)."""
        return bool(self.value[0])

    @property
    def mlflow_status(self) -> str:
        return str(self.value[1])

    @property
    def exit_code(self) -> int:
        return int(self.value[2])


class Sink(Protocol):
    """One tracker's client for one trial. Every method may raise when the tracker is unreachable."""

    name: str
    rewinds: bool
    """Whether the run can drop what it holds from a step on (TensorBoard can: its restart marker); such a run gets
    a restarted attempt's reports after its checkpoint again, the others keep the values they were sent first."""

    def create(self) -> str:
        """Create the trial's run (or pick its id) and return the run id; called once per trial."""

    def resume(self, run_id: str, from_step: int) -> str | None:
        """Attach to the trial's run (mark it running, describe it); returns its URL if it has one. ``from_step``:
        the first step it will be sent (a run that ``rewinds`` drops what it holds from there)."""

    def log(self, rows: Sequence[MetricRecord]) -> None:
        """Append metric rows (in report order) to the run."""

    def record_checkpoint(self, checkpoint: CheckpointRecord) -> None:
        """Record a completed checkpoint (uuid and steps; its files with ``log_checkpoints``)."""

    def record_deleted(self, checkpoint: CheckpointRecord) -> None:
        """Mark a checkpoint it recorded as deleted (retention removed its files)."""

    def close(self, outcome: Outcome) -> None:
        """End this process's use of the run with the status ``outcome`` stands for."""


_COUNTERS = frozenset({"batches", "epochs"})
"""The loop's counters in every report: the step already is the batch count, so trackers do not plot them."""


def step_values(rows: Iterable[MetricRecord]) -> list[tuple[int, float, dict[str, float]]]:
    """(steps, report time, {"<group>/<name>": number}) per row, numbers only (lists, strings and bools are left),
    without the loop's ``batches``/``epochs`` counters."""
    out = []
    for row in rows:
        values = {f"{row.group}/{key}": float(value) for key, value in row.metrics.items()
                  if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in _COUNTERS}
        if values:
            out.append((row.steps_completed, row.reported_time.timestamp(), values))
    return out


def flat_params(hparams: dict[str, Any], seed: int) -> dict[str, str]:
    """Hyperparameters flattened with dots (``net.width``) as text, plus the trial seed."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        elif prefix:  # no hyperparameters at all: no param with an empty key (MLflow refuses the whole batch)
            flat[prefix] = str(value)

    walk("", hparams)
    flat["seed"] = str(seed)
    return flat
