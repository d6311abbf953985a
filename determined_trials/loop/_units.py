"""Training units as values: ``Batch``, ``Epoch`` and ``Record``, each a period or explicit points.

A unit is parsed once (from config or the Trainer's arguments) and turned into a ``BatchRule``:
the set of batch counts at which it fires, given the epoch length and global batch size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from typing import Any

__all__ = ["Batch", "BatchRule", "Epoch", "Record", "TrainUnit", "unit_from_length"]


@dataclasses.dataclass(frozen=True)
class TrainUnit:
    """A length or period in some unit: an int period, or a collection of explicit points."""

    value: int | tuple[int, ...]

    def __init__(self, value: int | Collection[int]) -> None:
        object.__setattr__(self, "value", _normalise(type(self).__name__, value))

    @property
    def is_period(self) -> bool:
        """True for ``Unit(n)`` (every n), False for ``Unit([a, b, ...])`` (at those points)."""
        return isinstance(self.value, int)

    def to_batch_rule(self, *, epoch_len: int | None, global_batch_size: int | None) -> BatchRule:
        """The batch counts at which this unit fires."""
        raise NotImplementedError

    def to_batches(self, *, epoch_len: int | None, global_batch_size: int | None) -> int:
        """This unit as a total number of batches (a length, so it must be a period)."""
        if not isinstance(self.value, int):
            raise ValueError(f"{self!r} is a schedule of points; a length must be a single number")
        return self._batches_for(self.value, epoch_len, global_batch_size)

    def _batches_for(self, count: int, epoch_len: int | None, global_batch_size: int | None) -> int:
        raise NotImplementedError

    def __repr__(self) -> str:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return f"{type(self).__name__}({value})"


class Batch(TrainUnit):
    """A number of batches (global steps)."""

    def to_batch_rule(self, *, epoch_len: int | None, global_batch_size: int | None) -> BatchRule:
        return BatchRule(self.value, scale=1)

    def _batches_for(self, count: int, epoch_len: int | None, global_batch_size: int | None) -> int:
        return count


class Epoch(TrainUnit):
    """A number of passes over the training data; needs a loader with a length."""

    def to_batch_rule(self, *, epoch_len: int | None, global_batch_size: int | None) -> BatchRule:
        return BatchRule(self.value, scale=_require_epoch_len(self, epoch_len))

    def _batches_for(self, count: int, epoch_len: int | None, global_batch_size: int | None) -> int:
        return count * _require_epoch_len(self, epoch_len)


class Record(TrainUnit):
    """A number of training records (samples); converted with the global batch size."""

    def to_batch_rule(self, *, epoch_len: int | None, global_batch_size: int | None) -> BatchRule:
        size = _require_batch_size(self, global_batch_size)
        if isinstance(self.value, int):
            return BatchRule(max(self.value // size, 1), scale=1)
        return BatchRule(tuple(sorted({max(p // size, 1) for p in self.value})), scale=1)

    def _batches_for(self, count: int, epoch_len: int | None, global_batch_size: int | None) -> int:
        return max(count // _require_batch_size(self, global_batch_size), 1)


@dataclasses.dataclass(frozen=True)
class BatchRule:
    """Fires at batch counts ``scale * k`` where k matches ``value`` (every n, or the listed points)."""

    value: int | tuple[int, ...]
    scale: int = 1

    def fires(self, batches: int) -> bool:
        """True when the rule fires after ``batches`` batches in all."""
        if batches <= 0 or batches % self.scale:
            return False
        count = batches // self.scale
        return count % self.value == 0 if isinstance(self.value, int) else count in self.value

    def next_after(self, batches: int) -> int | None:
        """The smallest batch count greater than ``batches`` at which the rule fires, if any."""
        count = batches // self.scale
        if isinstance(self.value, int):
            return (count // self.value + 1) * self.value * self.scale
        later = [p for p in self.value if p * self.scale > batches]
        return min(later) * self.scale if later else None


def unit_from_length(value: int, unit: str | None, *, default: type[TrainUnit] = Batch) -> TrainUnit:
    """A config length ({batches|records|epochs: n}, or a bare n in ``default`` units) as a unit."""
    classes: dict[str | None, type[TrainUnit]] = {
        "batches": Batch, "records": Record, "epochs": Epoch, None: default,
    }
    return classes[unit](value)


def _normalise(name: str, value: Any) -> int | tuple[int, ...]:
    if isinstance(value, bool):
        raise TypeError(f"{name}() takes an int or a collection of ints, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{name}({value}): a period must be >= 1 (leave the period unset for 'never')")
        return value
    if isinstance(value, Collection) and not isinstance(value, (str, bytes)):
        points = sorted({int(p) for p in value})
        if not points or points[0] < 1 or any(isinstance(p, bool) for p in value):
            raise ValueError(f"{name}({list(value)!r}): points must be a non-empty collection of ints >= 1")
        return tuple(points)
    raise TypeError(f"{name}() takes an int or a collection of ints, got {value!r}")


def _require_epoch_len(unit: TrainUnit, epoch_len: int | None) -> int:
    if epoch_len is None or epoch_len >= math.inf or epoch_len < 1:
        raise ValueError(
            f"{unit!r} needs the epoch length, but the training data has none (a stream, i.e. an "
            "IterableDataset, or a loader without __len__): give lengths and periods in batches or records "
            "(Batch(...)/Record(...), or batches:/records: in the config)"
        )
    return epoch_len


def _require_batch_size(unit: TrainUnit, global_batch_size: int | None) -> int:
    if not global_batch_size:
        raise ValueError(
            f"{unit!r} needs the global batch size: set the hyperparameter 'global_batch_size' "
            "or use Batch(...)/Epoch(...) units"
        )
    return global_batch_size
