"""What every torch-based trial context offers besides wrapping (PyTorch and DeepSpeed): where its
fields come from, the device and `to_device`, reducers (wrapped, reset and reduced as Determined's
context does), the position in training (read from the loop's clock), TensorBoard (lazy writer,
metric-logging switch) and the profiler."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from determined_trials.loop import Clock, ClockView, allgather
from determined_trials.pytorch._tensorboard import make_profiler, make_summary_writer
from determined_trials.pytorch.device import to_device
from determined_trials.pytorch.metrics import MetricReducer, ReducerRegistry

if TYPE_CHECKING:
    from determined_trials.core import Context, DistributedContext

__all__ = ["TrialServices"]

class TrialServices:
    """Mixin of the PyTorch and DeepSpeed trial contexts; ``_init_services`` sets its fields."""

    _core: Context | None  # set by TrialContext._init_identity

    if TYPE_CHECKING:  # TrialContext's: every context with this mixin is one
        @property
        def distributed(self) -> DistributedContext: ...

        def get_tensorboard_path(self) -> Path: ...

    def _init_services(self, core_context: Context | None, enable_tensorboard_logging: bool,
                       device: torch.device) -> None:
        self._device = device
        self._moved_warned: set[type] = set()
        self.reducers = ReducerRegistry()
        self.set_enable_tensorboard_logging(enable_tensorboard_logging)
        self._tb_writer: Any = None
        self._profiler: torch.profiler.profile | None = None
        self._clock: ClockView = Clock().view  # no batch yet; each fit's adapter hands its clock's view over

    def _read_clock(self, clock: ClockView) -> None:
        """Trainer hook, as training starts: the position getters read ``clock`` (the loop advances it)."""
        self._clock = clock

    def _require_batch_idx(self, what: str) -> int:
        batch_idx = self._clock.batch_idx
        if batch_idx is None:
            raise RuntimeError(
                f"{what} needs the current batch, which is only known once training has started: "
                "call it from train_batch (or a callback during training)"
            )
        return batch_idx

    def current_train_batch(self) -> int:
        """The 0-based global index of the batch being trained (the `batch_idx` of train_batch)."""
        return self._require_batch_idx("current_train_batch()")

    def current_train_epoch(self) -> int:
        """The 0-based index of the epoch being trained (the `epoch_idx` of train_batch)."""
        return self._epoch_position("current_train_epoch()")[0]

    def is_epoch_start(self) -> bool:
        """Whether the current batch is the first of its epoch."""
        return self._epoch_position("is_epoch_start()")[1] == 0

    def is_epoch_end(self) -> bool:
        """Whether the current batch is the last of its epoch."""
        in_epoch = self._epoch_position("is_epoch_end()")[1]
        epoch_len = self._clock.epoch_len
        if epoch_len is None:
            raise RuntimeError(_UNKNOWN_EPOCH.format(what="is_epoch_end()"))
        return in_epoch == epoch_len - 1

    def _epoch_position(self, what: str) -> tuple[int, int]:
        self._require_batch_idx(what)
        position = self._clock.epoch_position()
        if position is None:
            raise RuntimeError(_UNKNOWN_EPOCH.format(what=what))
        return position

    @property
    def device(self) -> torch.device:
        """Where wrapped models and `to_device` data go."""
        return self._device

    def to_device(self, data: Any) -> Any:
        """`data` moved to `device` (tensors, numeric numpy arrays, objects with `.to`, nested in
        dicts, lists, tuples and namedtuples); anything else is returned as is, with one warning
        per type."""
        return to_device(data, self._device, self._moved_warned)

    def wrap_reducer(
        self,
        reducer: MetricReducer | Callable[[list[Any]], Any],
        name: str | None = None,
        for_training: bool = True,
        for_validation: bool = True,
    ) -> MetricReducer:
        """Register a `MetricReducer` (or a function of the list of all updates); returns the
        object to `update()`. See `ReducerRegistry.wrap`."""
        return self.reducers.wrap(reducer, name=name, for_training=for_training, for_validation=for_validation)

    def reset_reducers(self) -> None:
        """Reset every wrapped reducer (the trainer does this before each training run and validation)."""
        self.reducers.reset(True)
        self.reducers.reset(False)

    def reduce_metrics(self, for_training: bool) -> dict[str, Any]:
        """The metrics of the reducers wrapped for training (True) or validation (False), reduced across
        every process with one allgather; call it on every process."""
        return self.reducers.reduce(for_training, partial(allgather, self.distributed))

    def run_cross_slot_reduction(self, reducables: list[Any], per_slot_metrics: list[list[Any]]) -> dict[str, Any]:
        """The metrics of ``reducables`` (reducers ``wrap_reducer`` returned) from every process's
        ``per_slot_reduce()`` results, ``per_slot_metrics[process][i]`` being ``reducables[i]``'s (e.g.
        gathered on the chief), named as they were wrapped."""
        return self.reducers.cross_slot_of(reducables, per_slot_metrics)

    def get_enable_tensorboard_logging(self) -> bool:
        """Whether the trainer writes reported metrics to TensorBoard."""
        return self._enable_tensorboard_logging

    def set_enable_tensorboard_logging(self, enable_tensorboard_logging: bool) -> None:
        """Turn the trainer's TensorBoard metric logging on or off."""
        if not isinstance(enable_tensorboard_logging, bool):
            raise TypeError(f"enable_tensorboard_logging must be True or False, got {enable_tensorboard_logging!r}")
        self._enable_tensorboard_logging = enable_tensorboard_logging

    def get_tensorboard_writer(self) -> Any:
        """A `torch.utils.tensorboard.SummaryWriter` in the trial's TensorBoard folder (created on
        first use; closed by the trainer at the end)."""
        if self._tb_writer is None:
            self._tb_writer = make_summary_writer(self.get_tensorboard_path())
        return self._tb_writer

    def set_profiler(self, *args: Any, **kwargs: Any) -> None:
        """Profile training with `torch.profiler.profile(*args, **kwargs)`; traces go to the
        TensorBoard folder. The trainer enters it before training and steps it every batch."""
        profiler = make_profiler(self.get_tensorboard_path(), args, kwargs)
        if self._profiler is not None:
            warnings.warn("set_profiler() called again: the new profiler replaces the first", stacklevel=2)
        self._profiler = profiler

    def _close(self) -> None:
        """Trainer hook at shutdown: flush and close the SummaryWriter."""
        if self._tb_writer is not None:
            self._tb_writer.close()
            self._tb_writer = None



_UNKNOWN_EPOCH = (
    "{what} needs the epoch length, but the training data loader has no len(); use a "
    "det.pytorch.DataLoader or a loader over a sized dataset"
)
