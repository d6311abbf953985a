"""``TrialStore``: the store calls a trial process may make, answered by the run folder's ``LocalStore`` and by
the runner's store channel (``core.channel``), whose list of served methods is ``TRIAL_STORE_METHODS``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from determined_trials.core.store._records import (
        CheckpointRecord,
        Experiment,
        MetricRecord,
        SearcherOpRecord,
        Trial,
    )

__all__ = ["TRIAL_STORE_METHODS", "TrialStore"]


class TrialStore(Protocol):
    """The Core API's writes of one trial and the few reads trials make (``LocalStore`` documents each).

    Nothing here creates, deletes or ends an experiment: that is the runner's (or a plain script's own store's).
    """

    # -- the trial's state, display fields and searcher progress ------------------------------------
    def set_trial_state(self, trial_id: int, state: str, reason: str | None = None) -> None: ...

    def set_trial_status(self, trial_id: int, status: str) -> None: ...

    def set_trial_progress(self, trial_id: int, progress: float) -> None: ...

    def set_trial_metadata(self, trial_id: int, metadata: dict[str, Any]) -> None: ...

    def set_trial_early_exit(self, trial_id: int, reason: str) -> None: ...

    def record_searcher_op(self, trial_id: int, length: int, metric: float | None, completed: bool) -> None: ...

    # -- metrics and checkpoint records -------------------------------------------------------------
    def add_metrics(self, *, trial_id: int, group: str, steps_completed: int, metrics: dict[str, Any],
                    batch_metrics: list[dict[str, Any]] | None = None) -> None: ...

    def add_metrics_reports(self, *, trial_id: int, reports: Sequence[dict[str, Any]]) -> None: ...

    def supersede_metrics_after(self, trial_id: int, steps_completed: int | None) -> int: ...

    def add_checkpoint(self, *, uuid: str, trial_id: int | None, steps_completed: int, metadata: dict[str, Any],
                       resources: dict[str, int], storage: str, pending: bool = False) -> None: ...

    def pending_checkpoints(self, trial_id: int) -> list[str]: ...

    def drop_pending_checkpoint(self, uuid: str) -> None: ...

    def mark_checkpoint_deleted(self, uuid: str) -> None: ...

    def add_trial_time(self, trial_id: int, parts: Mapping[str, float], batches_reached: int | None = None) -> None: ...

    # -- reads --------------------------------------------------------------------------------------
    def experiment(self, experiment_id: int) -> Experiment: ...

    def trial(self, trial_id: int) -> Trial: ...

    def get_trial_metadata(self, trial_id: int) -> dict[str, Any]: ...

    def metrics(self, trial_id: int, group: str | None = None, *,
                include_superseded: bool = False) -> list[MetricRecord]: ...

    def searcher_ops(self, trial_id: int) -> list[SearcherOpRecord]: ...

    def best_validation(self, experiment_id: int, metric: str, smaller_is_better: bool) -> float | None: ...

    def checkpoints(self, *, trial_id: int | None = None, experiment_id: int | None = None,
                    include_deleted: bool = False) -> list[CheckpointRecord]: ...

    def latest_checkpoint(self, trial_id: int) -> CheckpointRecord | None: ...

    def batches_reached(self, trial_id: int) -> int: ...

    # -- the trial's experiment-tracker runs (the chief's forwarder) --------------------------------
    def tracker_run(self, trial_id: int, tracker: str) -> dict[str, Any] | None: ...

    def set_tracker_run(self, trial_id: int, tracker: str, run_id: str, url: str | None = None) -> None: ...

    def set_tracker_forwarded(self, trial_id: int, tracker: str, metric_id: int,
                              progress: dict[str, Any] | None = None) -> None: ...

    def add_tracker_checkpoint(self, trial_id: int, tracker: str, uuid: str) -> None: ...

    def metrics_after(self, trial_id: int, after_id: int, *, limit: int = 1000) -> list[MetricRecord]: ...

    def metrics_at(self, trial_id: int, group: str, steps_completed: int, before_id: int) -> list[MetricRecord]: ...


TRIAL_STORE_METHODS: frozenset[str] = frozenset(
    name for name, member in vars(TrialStore).items() if callable(member) and not name.startswith("_"))
"""The names of ``TrialStore``'s methods: what the store channel serves."""
