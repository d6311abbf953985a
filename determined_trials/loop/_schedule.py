"""The schedule: a small pure object saying where the next boundary is and what fires there."""

from __future__ import annotations

import dataclasses
import enum

from determined_trials.loop._units import BatchRule

__all__ = ["Boundary", "Schedule"]


class Boundary(enum.Flag):
    """What happens after a workload: the length was reached, report, validate, checkpoint."""

    NONE = 0
    TARGET = enum.auto()
    REPORT = enum.auto()
    VALIDATE = enum.auto()
    CHECKPOINT = enum.auto()


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Periods as batch rules (None = never); ``target`` is the batch count to train to."""

    reporting: BatchRule | None = None
    validation: BatchRule | None = None
    checkpoint: BatchRule | None = None

    def next_boundary(self, batches_trained: int, target: int) -> int:
        """The batch count at which the next workload ends (never beyond ``target``)."""
        candidates = [target]
        for rule in self._rules():
            nxt = rule.next_after(batches_trained)
            if nxt is not None:
                candidates.append(nxt)
        return min(candidates)

    def fired(self, batches_trained: int, target: int) -> Boundary:
        """The boundaries that fire after ``batches_trained`` batches."""
        fired = Boundary.NONE
        if batches_trained >= target:
            fired |= Boundary.TARGET
        if self.reporting is not None and self.reporting.fires(batches_trained):
            fired |= Boundary.REPORT
        if self.validation is not None and self.validation.fires(batches_trained):
            fired |= Boundary.VALIDATE
        if self.checkpoint is not None and self.checkpoint.fires(batches_trained):
            fired |= Boundary.CHECKPOINT
        return fired

    def _rules(self) -> list[BatchRule]:
        return [r for r in (self.reporting, self.validation, self.checkpoint) if r is not None]
