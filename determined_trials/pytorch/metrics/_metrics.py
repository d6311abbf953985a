"""Training and validation metric accumulation: values stay on the device during a workload and
cross to the host once, at the boundary (``summary``), then across ranks with one allgather
(``loop.reduce_across_ranks``, which ``combine``s every rank's summary)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from determined_trials.pytorch.metrics._accumulator import (
    Accumulator,
    KeySummary,
    Summary,
    combine,
    keys_error,
    shape_of,
    to_host,
)
from determined_trials.pytorch.metrics._reducer import Reducer

__all__ = ["TrainingMetrics", "ValidationMetrics"]

class _Metrics:
    """Shared accumulation: per-key accumulators, a batch count and a total weight."""

    _what = "the trial"

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything (start of a workload)."""
        self._accs: dict[str, Accumulator] | None = None
        self._batches = 0
        self._weight: float = 0
        self.total_batches = 0

    @property
    def num_batches(self) -> int:
        """Batches added on this rank since the last reset."""
        return self._batches

    def _add(self, output: Mapping[str, Any], weight: float | None) -> None:
        accs = self._accs
        if accs is None:
            shapes = {key: shape_of(key, value) for key, value in output.items()}
            accs = self._accs = {k: Accumulator(k, self._reducer_for(k), s) for k, s in shapes.items()}
        elif output.keys() != accs.keys():
            raise keys_error(self._what, list(accs), list(output))
        for key, value in output.items():
            accs[key].add(value, weight)
        self._batches += 1
        self._weight += 1 if weight is None else weight

    def _reducer_for(self, key: str) -> Reducer:
        return Reducer.AVG

    def summary(self) -> Summary:
        """This rank's picklable result, with ONE host transfer (per device)."""
        accs = list((self._accs or {}).values())
        device = to_host(accs)
        keys: dict[str, KeySummary] = {}
        for acc in accs:
            parts = [part for part in (device.get(acc.key), acc.host) if part is not None]
            value = parts[0] if len(parts) == 1 else combine(acc.reducer, *parts)
            integral = acc.device_integral and acc.host_integral and acc.reducer is not Reducer.AVG
            keys[acc.key] = KeySummary(acc.reducer, np.asarray(value, dtype=np.float64), integral)
        return Summary(self._batches, float(self._weight), keys)

    def combine(self, summaries: Sequence[Summary]) -> dict[str, Any]:
        """The metrics over every rank's ``summary()`` (rank order), as Python values."""
        ranks = [(rank, s) for rank, s in enumerate(summaries) if s.batches > 0]
        self.total_batches = sum(s.batches for _, s in ranks)
        if not ranks:
            return {}
        first_rank, first = ranks[0]
        for rank, other in ranks[1:]:
            _check_same_keys(first_rank, first, rank, other)
        total_weight = sum(s.weight for _, s in ranks)
        metrics: dict[str, Any] = {}
        for key, ref in first.keys.items():
            values = [s.keys[key].value for _, s in ranks]
            if ref.reducer is Reducer.AVG:
                if total_weight == 0:
                    raise ValueError(
                        f"cannot average metric {key!r}: every batch counted 0 records; make "
                        "get_batch_length(batch) return the number of records in the batch"
                    )
                result = (values[0] if len(values) == 1 else np.sum(values, axis=0)) / total_weight
            elif ref.reducer is Reducer.SUM:
                result = values[0] if len(values) == 1 else np.sum(values, axis=0)
            else:
                reduce = np.max if ref.reducer is Reducer.MAX else np.min
                result = reduce(values, axis=0)
            if all(s.keys[key].integral for _, s in ranks):
                result = np.rint(result).astype(np.int64)
            metrics[key] = result.reshape(()).item() if result.size == 1 else result.tolist()
        return metrics


def _check_same_keys(rank_a: int, a: Summary, rank_b: int, b: Summary) -> None:
    if a.keys.keys() != b.keys.keys():
        raise ValueError(
            f"ranks report different metric names: rank {rank_a} {sorted(a.keys)}, rank {rank_b} "
            f"{sorted(b.keys)}; every rank must return the same metrics"
        )
    for key, ref in a.keys.items():
        if ref.value.shape != b.keys[key].value.shape:
            raise ValueError(
                f"metric {key!r} has shape {list(ref.value.shape)} on rank {rank_a} but "
                f"{list(b.keys[key].value.shape)} on rank {rank_b}; use one shape on every rank"
            )


class TrainingMetrics(_Metrics):
    """The mean of the ``train_batch`` outputs over the batches of a workload and all ranks.

    ``train_batch`` returns a tensor (reported as ``loss``) or a dict of tensors, numpy arrays or
    Python numbers with the same names in every batch. Tensors stay on their device (detached,
    never synchronised) until ``summary``; Python numbers are summed in Python. The result is the
    mean over every batch of every rank (ranks weighted by their batch counts). A non-scalar
    metric is averaged element-wise and reported as a nested list of the same shape (a one-element
    one as a number), so its shape must not change within a workload.
    """

    _what = "train_batch"

    def loss_sink(self) -> tuple[list[torch.Tensor], int] | None:
        """For the trainer's per-batch fast path: the pending list of a lone ``loss`` metric (append
        detached loss tensors to it, then ``count_losses``) and the room left in it before it must be
        compacted; None until the first output was a lone tensor, or when it was not."""
        accs = self._accs
        if accs is None or len(accs) != 1 or "loss" not in accs:
            return None
        loss = accs["loss"]
        if loss.weights:
            return None
        return loss.pending, loss.limit - len(loss.pending)

    def local_loss_mean(self) -> dict[str, Any] | None:
        """``combine([summary()])`` for one rank whose outputs are a lone scalar loss tensor (the same
        float64 sum over the same weight, with fewer steps); None when that is not the case."""
        accs = self._accs
        if accs is None or len(accs) != 1 or "loss" not in accs or not self._weight:
            return None
        loss = accs["loss"]
        if loss.shape != () or loss.host is not None:
            return None
        loss.compact()
        if loss.on_device is None or loss.on_device.dtype != torch.float64:
            return None
        self.total_batches = self._batches
        return {"loss": loss.on_device.item() / self._weight}

    def count_losses(self, batches: int) -> None:
        """Count ``batches`` losses appended to ``loss_sink()``'s list; compacts it once full."""
        assert self._accs is not None
        self._batches += batches
        self._weight += batches
        loss = self._accs["loss"]
        if len(loss.pending) >= loss.limit:
            loss.compact()

    def add(self, output: Any) -> None:
        """Record one batch's output (no device-to-host transfer)."""
        if isinstance(output, torch.Tensor):
            accs = self._accs
            if accs is not None and len(accs) == 1 and "loss" in accs:  # the common case: the loss alone
                accs["loss"].add(output, None)
                self._batches += 1
                self._weight += 1
                return
            output = {"loss": output}
        elif not isinstance(output, Mapping):
            raise TypeError(
                f"train_batch must return a tensor (the loss) or a dict of metrics, got "
                f"{type(output).__qualname__}"
            )
        self._add(output, None)


class ValidationMetrics(_Metrics):
    """The reduction of the ``evaluate_batch`` outputs by ``evaluation_reducer()``.

    ``reducer`` is one Reducer for every metric or a dict with one per metric name. AVG is the
    mean weighted by records (sum of value * records over total records, across ranks too), SUM
    the total, MAX/MIN the extreme value; non-scalar metrics are reduced element-wise and reported
    as nested lists. Integer metrics under SUM, MAX and MIN stay integers.
    """

    _what = "evaluate_batch"

    def __init__(self, reducer: Reducer | Mapping[str, Reducer] = Reducer.AVG) -> None:
        if isinstance(reducer, Mapping):
            for key, value in reducer.items():
                if not isinstance(key, str) or not isinstance(value, Reducer):
                    raise TypeError(
                        "evaluation_reducer() must return a Reducer or a dict of metric name -> "
                        f"Reducer (e.g. Reducer.AVG); got {key!r}: {value!r}"
                    )
        elif not isinstance(reducer, Reducer):
            raise TypeError(
                "evaluation_reducer() must return a Reducer (e.g. Reducer.AVG) or a dict of "
                f"metric name -> Reducer, got {reducer!r}"
            )
        self._reducer = reducer
        super().__init__()

    @property
    def total_records(self) -> int:
        """Records over every rank, known after ``combine``."""
        return self._total_records

    def reset(self) -> None:
        super().reset()
        self._total_records = 0

    def add(self, output: Any, num_records: int) -> None:
        """Record one batch's metrics and its record count (no device-to-host transfer)."""
        if not isinstance(output, Mapping):
            raise TypeError(
                f"evaluate_batch must return a dict of metric name -> value, got "
                f"{type(output).__qualname__}"
            )
        if isinstance(num_records, bool) or not isinstance(num_records, (int, np.integer)):
            raise TypeError(
                f"the record count of a batch must be an int, got {num_records!r}; check "
                "get_batch_length(batch)"
            )
        if num_records < 0:
            raise ValueError(f"a batch cannot hold {num_records} records; check get_batch_length")
        reducer = self._reducer
        if self._accs is None and isinstance(reducer, Mapping) and reducer.keys() != output.keys():
            raise ValueError(
                f"evaluation_reducer() returned reducers for {sorted(reducer)} but evaluate_batch "
                f"returned metrics {sorted(map(str, output))}; return a single Reducer or one "
                "Reducer for every metric name"
            )
        self._add(output, int(num_records))

    def _reducer_for(self, key: str) -> Reducer:
        return self._reducer[key] if isinstance(self._reducer, Mapping) else self._reducer

    def combine(self, summaries: Sequence[Summary]) -> dict[str, Any]:
        if not any(s.batches for s in summaries):
            raise RuntimeError(
                "the validation data loader yielded no batches on any rank; make "
                "build_validation_data_loader() return a non-empty loader"
            )
        self._total_records = int(sum(s.weight for s in summaries))
        return super().combine(summaries)
