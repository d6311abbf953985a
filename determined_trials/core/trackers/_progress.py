"""What one tracker run holds of a trial's metric rows (kept in the store's ``tracker_runs.progress``), and which of
the next rows go to it: every current row as soon as it is stored, each (metric, step) once. A restart reports again
the steps after its checkpoint; a run that can drop points (TensorBoard) is rewound to the restart's step and gets
them again, any other keeps the value it was sent first, and a value the restart changed is recorded as a superseded
point the run holds."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from determined_trials.core.store import MetricRecord

__all__ = ["Progress", "numbers", "plan"]


def numbers(row: MetricRecord) -> dict[str, float]:
    """The row's values a tracker takes: numbers only (lists, strings and bools stay in the store)."""
    return {key: float(value) for key, value in row.metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


@dataclasses.dataclass
class Progress:
    """``forwarded``: every row of the trial up to this id has been dealt with; ``steps``: per group, the highest
    step the run was sent; ``unsent``: id ranges (inclusive, rows up to ``forwarded``) the run was not sent
    (superseded before they went, or every value already held); ``held``: per ``group/key``, the steps at which the
    run holds a value that the store's current report replaced with another; ``dropped``: [last row id, step] per
    rewind of a run that can drop points: it no longer holds what rows up to that id sent at that step or later."""

    forwarded: int = 0
    steps: dict[str, int] = dataclasses.field(default_factory=dict)
    unsent: list[list[int]] = dataclasses.field(default_factory=list)
    held: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    dropped: list[list[int]] = dataclasses.field(default_factory=list)

    @classmethod
    def from_record(cls, forwarded_id: int, progress: dict[str, Any]) -> Progress:
        return cls(forwarded=int(forwarded_id), steps={k: int(v) for k, v in progress.get("steps", {}).items()},
                   unsent=[[int(a), int(b)] for a, b in progress.get("unsent", [])],
                   held={k: [int(s) for s in v] for k, v in progress.get("held", {}).items()},
                   dropped=[[int(a), int(b)] for a, b in progress.get("dropped", [])])

    def as_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "unsent": self.unsent, "held": self.held, "dropped": self.dropped}

    def copy(self) -> Progress:
        return Progress(self.forwarded, dict(self.steps), [list(r) for r in self.unsent],
                        {k: list(v) for k, v in self.held.items()}, [list(r) for r in self.dropped])

    @property
    def next_step(self) -> int:
        """The step after the highest the run was sent (0 when it was sent nothing)."""
        return max(self.steps.values(), default=-1) + 1

    def was_sent(self, row_id: int, step: int) -> bool:
        """Whether the run holds what row ``row_id`` (at ``step``) sent."""
        return (row_id <= self.forwarded and not any(a <= row_id <= b for a, b in self.unsent)
                and not any(row_id <= last and step >= start for last, start in self.dropped))

    def rewound(self, from_step: int) -> Progress:
        """The progress of the run once it dropped every point at ``from_step`` or later: those steps go again."""
        new = self.copy()
        if from_step >= new.next_step:
            return new
        new.steps = {group: min(step, from_step - 1) for group, step in new.steps.items() if from_step > 0}
        new.held = {key: kept for key, steps in new.held.items() if (kept := [s for s in steps if s < from_step])}
        new.dropped.append([new.forwarded, from_step])
        return new

    def _leave(self, row_id: int) -> None:
        if self.unsent and self.unsent[-1][1] == self.forwarded:  # the row before it was left too: one range
            self.unsent[-1][1] = row_id
        else:
            self.unsent.append([row_id, row_id])

    def _mark_held(self, key: str, step: int, differs: bool) -> None:
        steps = self.held.setdefault(key, [])
        if differs and step not in steps:
            steps.append(step)
            steps.sort()
        elif not differs and step in steps:
            steps.remove(step)
        if not steps:
            del self.held[key]


def plan(progress: Progress, rows: Sequence[MetricRecord],
         earlier: Callable[[MetricRecord], list[MetricRecord]]) -> tuple[list[MetricRecord], Progress]:
    """The rows (in id order, after ``progress.forwarded``) to send, each with only the values the run lacks, and
    the progress once they are sent. ``earlier(row)``: the trial's rows at the row's group and step before it."""
    new = progress.copy()
    out: list[MetricRecord] = []
    for row in rows:
        values = numbers(row)
        if row.superseded_time is None and values and row.steps_completed <= new.steps.get(row.group, -1):
            values = _not_held(new, row, values, earlier(row))
        if row.superseded_time is not None or (numbers(row) and not values):
            new._leave(row.id)
        elif values:
            out.append(dataclasses.replace(row, metrics=values))
            new.steps[row.group] = max(new.steps.get(row.group, -1), row.steps_completed)
        new.forwarded = row.id
    return out, new


def _not_held(progress: Progress, row: MetricRecord, values: dict[str, float],
              earlier: list[MetricRecord]) -> dict[str, float]:
    """``values`` less those the run already holds at the row's step (sent from an earlier row: the first sent row
    with the key is the one whose value the run got), recording where the held value differs."""
    held: dict[str, float] = {}
    for other in earlier:
        if progress.was_sent(other.id, other.steps_completed):
            for key, value in numbers(other).items():
                held.setdefault(key, value)
    for key in values.keys() & held.keys():
        same = held[key] == values[key] or (math.isnan(held[key]) and math.isnan(values[key]))
        progress._mark_held(f"{row.group}/{key}", row.steps_completed, not same)
    return {key: value for key, value in values.items() if key not in held}
