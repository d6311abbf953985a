"""Training and validation metric accumulation: values stay on the device during a workload and
cross to the host once, at the boundary (``summary``), then across ranks with one allgather
(``loop.reduce_across_ranks``, which ``combine``s every rank's summary)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from determined_trials.pytorch._reducer import Reducer

__all__ = ["TrainingMetrics", "ValidationMetrics"]

# Pending device values are folded into the running result once this many elements are waiting
# (and at most every _MAX_PENDING batches), which bounds memory without a kernel per batch.
_PENDING_ELEMENTS = 1 << 16
_MAX_PENDING = 1024
_NUMPY_KINDS = "biuf"


class _KeySummary(NamedTuple):
    reducer: Reducer
    value: np.ndarray
    integral: bool


class _Summary(NamedTuple):
    """One rank's picklable result: batch count, total weight, and per-key reduced values."""

    batches: int
    weight: float
    keys: dict[str, _KeySummary]


class _Accumulator:
    """The running reduction of one metric key: device tensors pending, device and host parts."""

    __slots__ = ("device_integral", "host", "host_integral", "key", "limit", "on_device",
                 "pending", "reducer", "shape", "weights")

    def __init__(self, key: str, reducer: Reducer, shape: tuple[int, ...]) -> None:
        self.key, self.reducer, self.shape = key, reducer, shape
        self.limit = max(1, min(_MAX_PENDING, _PENDING_ELEMENTS // max(1, int(np.prod(shape)))))
        self.pending: list[torch.Tensor] = []
        self.weights: list[float] = []
        self.on_device: torch.Tensor | None = None
        self.host: Any = None
        self.device_integral = self.host_integral = True

    def add(self, value: Any, weight: float | None) -> None:
        if isinstance(value, torch.Tensor):
            if value.shape != self.shape:
                raise _shape_error(self.key, self.shape, tuple(value.shape))
            self.pending.append(value.detach())
            if weight is not None:
                self.weights.append(weight)
            if len(self.pending) >= self.limit:
                self.compact()
            return
        value = _host_value(self.key, value)
        shape = () if isinstance(value, (int, float)) else value.shape
        if shape != self.shape:
            raise _shape_error(self.key, self.shape, shape)
        self.host_integral = self.host_integral and _is_integral(value)
        if weight is not None and self.reducer is Reducer.AVG:
            value = value * weight
        self.host = value if self.host is None else _combine(self.reducer, self.host, value)

    def compact(self) -> None:
        """Fold the pending tensors into the device result (kernels only, no host sync)."""
        if not self.pending:
            return
        stacked = self._stack_pending()
        if stacked.is_complex():
            raise TypeError(f"metric {self.key!r} is a complex tensor; report real numbers")
        integral = not stacked.is_floating_point() and self.reducer is not Reducer.AVG
        float_dtype = torch.float32 if stacked.device.type == "mps" else torch.float64
        stacked = stacked.to(torch.int64 if integral else float_dtype)
        self.device_integral = self.device_integral and integral
        if self.reducer is Reducer.MAX:
            part = stacked.amax(0)
        elif self.reducer is Reducer.MIN:
            part = stacked.amin(0)
        elif self.weights and self.reducer is Reducer.AVG:
            weights = torch.tensor(self.weights, dtype=stacked.dtype)
            if stacked.is_cuda:
                weights = weights.pin_memory()
            weights = weights.to(stacked.device, non_blocking=True)
            part = (stacked * weights.reshape(-1, *[1] * len(self.shape))).sum(0)
        else:
            part = stacked.sum(0)
        self.on_device = part if self.on_device is None else _combine(self.reducer, self.on_device, part)
        self.pending.clear()  # in place: the trainer's fast path appends to this very list
        self.weights.clear()

    def _stack_pending(self) -> torch.Tensor:
        """The pending tensors stacked, after checking their shapes (the trainer's fast path appends
        losses without a per-batch check; a changed shape is reported here, at the boundary)."""
        try:
            stacked = torch.stack(self.pending)
        except RuntimeError:
            stacked = None
        if stacked is None or tuple(stacked.shape[1:]) != self.shape:
            wrong = next((t for t in self.pending if tuple(t.shape) != self.shape), self.pending[0])
            raise _shape_error(self.key, self.shape, tuple(wrong.shape))
        return stacked


def _combine(reducer: Reducer, left: Any, right: Any) -> Any:
    if reducer is Reducer.MAX or reducer is Reducer.MIN:
        if isinstance(left, torch.Tensor):
            return (torch.maximum if reducer is Reducer.MAX else torch.minimum)(left, right)
        return (np.maximum if reducer is Reducer.MAX else np.minimum)(left, right)
    return left + right


def _host_value(key: str, value: Any) -> Any:
    """A Python number or a numpy array; TypeError naming the key for anything else."""
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in _NUMPY_KINDS:
        array = np.array(value)
        return array.astype(np.int64) if array.dtype.kind == "b" else array
    raise TypeError(
        f"metric {key!r} is a {type(value).__module__}.{type(value).__qualname__}; metrics must be "
        "tensors, numpy arrays or Python numbers (return other values from a reducer instead)"
    )


def _is_integral(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, np.ndarray) and value.dtype.kind in "biu")


def _shape_of(key: Any, value: Any) -> tuple[int, ...]:
    if not isinstance(key, str):
        raise TypeError(f"metric names must be strings, got {key!r}")
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    return tuple(np.shape(_host_value(key, value)))


def _shape_error(key: str, expected: tuple[int, ...], got: tuple[int, ...]) -> ValueError:
    return ValueError(
        f"metric {key!r} has shape {list(got)} in this batch but {list(expected)} before; a metric "
        "must keep one shape for a whole workload (it is averaged element-wise)"
    )


def _keys_error(what: str, expected: Sequence[Any], got: Sequence[Any]) -> ValueError:
    missing = sorted(map(str, set(expected) - set(got)))
    extra = sorted(map(str, set(got) - set(expected)))
    return ValueError(
        f"{what} must return the same metric names for every batch: expected {expected}, "
        f"got {got} (missing {missing}, unexpected {extra})"
    )


def _to_host(accumulators: Sequence[_Accumulator]) -> dict[str, np.ndarray]:
    """Every device result, moved to the host with one transfer per device."""
    by_device: dict[torch.device, list[tuple[_Accumulator, torch.Tensor]]] = {}
    for acc in accumulators:
        acc.compact()
        if acc.on_device is not None:
            by_device.setdefault(acc.on_device.device, []).append((acc, acc.on_device))
    results: dict[str, np.ndarray] = {}
    for device, pairs in by_device.items():
        dtype = torch.float32 if device.type == "mps" else torch.float64
        flat = torch.cat([tensor.reshape(-1).to(dtype) for _, tensor in pairs])
        values = flat.cpu().numpy().astype(np.float64)
        offset = 0
        for acc, tensor in pairs:
            size = tensor.numel()
            results[acc.key] = values[offset:offset + size].reshape(acc.shape)
            offset += size
    return results


class _Metrics:
    """Shared accumulation: per-key accumulators, a batch count and a total weight."""

    _what = "the trial"

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything (start of a workload)."""
        self._accs: dict[str, _Accumulator] | None = None
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
            shapes = {key: _shape_of(key, value) for key, value in output.items()}
            accs = self._accs = {k: _Accumulator(k, self._reducer_for(k), s) for k, s in shapes.items()}
        elif output.keys() != accs.keys():
            raise _keys_error(self._what, list(accs), list(output))
        for key, value in output.items():
            accs[key].add(value, weight)
        self._batches += 1
        self._weight += 1 if weight is None else weight

    def _reducer_for(self, key: str) -> Reducer:
        return Reducer.AVG

    def summary(self) -> _Summary:
        """This rank's picklable result, with ONE host transfer (per device)."""
        accs = list((self._accs or {}).values())
        device = _to_host(accs)
        keys: dict[str, _KeySummary] = {}
        for acc in accs:
            parts = [part for part in (device.get(acc.key), acc.host) if part is not None]
            value = parts[0] if len(parts) == 1 else _combine(acc.reducer, *parts)
            integral = acc.device_integral and acc.host_integral and acc.reducer is not Reducer.AVG
            keys[acc.key] = _KeySummary(acc.reducer, np.asarray(value, dtype=np.float64), integral)
        return _Summary(self._batches, float(self._weight), keys)

    def combine(self, summaries: Sequence[_Summary]) -> dict[str, Any]:
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


def _check_same_keys(rank_a: int, a: _Summary, rank_b: int, b: _Summary) -> None:
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

    def combine(self, summaries: Sequence[_Summary]) -> dict[str, Any]:
        if not any(s.batches for s in summaries):
            raise RuntimeError(
                "the validation data loader yielded no batches on any rank; make "
                "build_validation_data_loader() return a non-empty loader"
            )
        self._total_records = int(sum(s.weight for s in summaries))
        return super().combine(summaries)
