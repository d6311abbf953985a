"""The PyTorch adapter's "train n batches": a tight loop over runs of batches inside one epoch, and
a batch-at-a-time loop for raw loaders (whose passes decide where epochs end)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from determined_trials.loop import HookRunner, TrialState
from determined_trials.pytorch._data_stream import TrainingStream
from determined_trials.pytorch._metrics import TrainingMetrics

if TYPE_CHECKING:
    from determined_trials.pytorch._context import PyTorchTrialContext
    from determined_trials.pytorch._trial import PyTorchTrial

__all__ = ["CPU", "BatchLoop", "cpu_tensors"]

CPU = torch.device("cpu")


class BatchLoop:
    """Mixin of the PyTorch adapter: ``train`` and the epoch hooks around it."""

    _trial: PyTorchTrial
    _context: PyTorchTrialContext
    _hooks: HookRunner
    _stream: Any
    _epoch_len: int | None
    _current_epoch: int | None
    _train_metrics: TrainingMetrics
    _kept_batches: list[Any] | None

    def train(self, num_batches: int, state: TrialState, should_stop: Callable[[], bool]) -> None:
        if not isinstance(self._stream, TrainingStream):  # a raw loader: its epochs end when a pass does
            self._train_raw_loader(num_batches, state, should_stop)
            return
        remaining = num_batches
        while remaining > 0:
            trained, stopped = self._train_run(remaining, state, should_stop)
            remaining -= trained
            if stopped:
                return

    def _train_run(self, limit: int, state: TrialState, should_stop: Callable[[], bool]) -> tuple[int, bool]:
        """Train up to ``limit`` batches of the current epoch in one tight loop: (batches trained, stopped).

        Per batch only what every batch needs runs: take the batch, set the position, ``train_batch``,
        keep the loss on the device, the stop check. The rest (LR schedulers, function reducers, the AMP
        scaler, gradient aggregation, the profiler, kept outputs, device moves) runs only when the trial
        uses it (``_general_batches``); otherwise, after a run's first batch, ``_plain_batches`` trains the
        rest.
        """
        context, metrics = self._context, self._train_metrics
        epoch_len = self._epoch_len
        assert epoch_len
        first = state.batches_trained
        epoch_idx, in_epoch = divmod(first, epoch_len)
        if in_epoch == 0:
            self._open_epoch(epoch_idx, state)
        elif self._current_epoch is None:  # resumed mid-epoch: it was opened before the stop
            self._current_epoch = epoch_idx
        count = min(limit, epoch_len - in_epoch)
        sink = metrics.loss_sink() if self._kept_batches is None else None
        count = min(count, sink[1]) if sink is not None else 1  # the first output sets the sink up
        context._epoch_len = epoch_len
        last_of_epoch = (epoch_idx + 1) * epoch_len - 1
        # this run's lone losses, handed to the metric's device list when the run ends (None: no sink yet)
        losses: list[torch.Tensor] | None = None if sink is None else []
        trained, stopped = 0, False
        try:
            trained, stopped = self._general_batches(first, count, epoch_idx, last_of_epoch, losses, should_stop)
            if not stopped and trained < count:
                trained, stopped = self._plain_batches(first, trained, count, epoch_idx, losses, should_stop)
        except BaseException:
            # the batch that raised does not count; the position says which one it was
            trained = max(0, (context._batch_idx or first) - first)
            raise
        finally:
            self._stream.advance(trained)
            state.batches_trained += trained
            if losses:
                sink[0].extend(losses)  # type: ignore[index]  # losses is a list only with a sink
                metrics.count_losses(len(losses))
        if first + trained - 1 == last_of_epoch:
            self._close_epoch(state)
        return trained, stopped

    def _general_batches(self, first: int, count: int, epoch_idx: int, last_of_epoch: int,
                         losses: list[torch.Tensor] | None, should_stop: Callable[[], bool]) -> tuple[int, bool]:
        """Batches ``first``.. with every per-batch step the trial uses; returns (trained, stopped).
        When nothing but the loss needs keeping (no per-batch steps, a loss sink, no device move) it
        returns after one batch, leaving the rest of the run to ``_plain_batches``."""
        context, epoch_len = self._context, self._epoch_len
        assert epoch_len
        add = self._add_and_keep if self._kept_batches is not None else self._train_metrics.add
        per_batch = self._needs_per_batch_steps()
        move = context.to_device if context.experimental._auto_to_device else None
        # on a CPU trial, a run whose first batch holds CPU tensors needs no move (to_device returns them)
        check_first = move is not None and context.device == CPU
        train_batch, iterator, tensor_type = self._trial.train_batch, self._stream.loader_iterator(), torch.Tensor
        preempt = getattr(should_stop, "local_preempt", None)
        trained = 0
        for batch_idx in range(first, first + count):
            context._batch_idx = batch_idx
            batch = next(iterator)
            if per_batch:
                context._start_known_batch(batch_idx, epoch_len)
            if check_first:
                check_first = False
                if cpu_tensors(batch):
                    move = None
            if move is not None:
                batch = move(batch)
            output = train_batch(batch, epoch_idx, batch_idx)
            if losses is not None and type(output) is tensor_type:
                losses.append(output.detach())
            else:
                add(output)
            if per_batch:
                self._finish_batch(batch_idx, epoch_idx, batch_idx == last_of_epoch)
            trained += 1
            # one process: read the two flags here, call the check only when one is set
            if (preempt is None or preempt.signalled or context._stop_requested) and should_stop():
                return trained, True
            if not per_batch and losses is not None and move is None and preempt is not None:
                break  # the rest of the run needs nothing more per batch
        return trained, False

    def _plain_batches(self, first: int, trained: int, count: int, epoch_idx: int, losses: list[torch.Tensor] | None,
                       should_stop: Callable[[], bool]) -> tuple[int, bool]:
        """The rest of a run (batches ``first + trained``..) when each batch needs only its position, the
        loss kept on the device and, on one process, two flag reads; returns (trained, stopped)."""
        assert losses is not None
        context, preempt = self._context, should_stop.local_preempt  # type: ignore[attr-defined]
        train_batch, iterator, tensor_type = self._trial.train_batch, self._stream.loader_iterator(), torch.Tensor
        keep, add = losses.append, self._train_metrics.add
        for batch_idx in range(first + trained, first + count):
            context._batch_idx = batch_idx
            output = train_batch(next(iterator), epoch_idx, batch_idx)
            if type(output) is tensor_type:
                keep(output.detach())
            else:
                add(output)  # a dict of metrics (or a wrong type: add raises, naming it)
            if (preempt.signalled or context._stop_requested) and should_stop():
                return batch_idx - first + 1, True
        return count, False

    def _needs_per_batch_steps(self) -> bool:
        """Whether each batch needs ``_start_known_batch``/``_finish_batch`` (else the position alone)."""
        context = self._context
        return bool(context.lr_schedulers or context.reducers.marks_batches or context._auto_scaler is not None
                    or context._aggregation_frequency > 1 or context._profiler is not None)

    def _finish_batch(self, batch_idx: int, epoch_idx: int, epoch_ended: bool) -> None:
        """After a batch: the AMP scaler's update, function reducers, LR schedulers, the profiler's step."""
        context = self._context
        context._end_batch()
        context.reducers.batch_end()
        for scheduler in context.lr_schedulers:
            scheduler.after_batch(batch_idx, context._optimizer_stepped_this_batch, epoch_ended, epoch_idx)
        if context._profiler is not None:
            context._profiler.step()

    def _train_raw_loader(self, num_batches: int, state: TrialState, should_stop: Callable[[], bool]) -> None:
        """``train`` over a raw loader's stream, one batch at a time (its passes decide the epochs)."""
        context, trial, stream = self._context, self._trial, self._stream
        epoch_len = self._epoch_len or 0
        add_metrics = self._add_and_keep if self._kept_batches is not None else self._train_metrics.add
        to_device = context.to_device if context.experimental._auto_to_device else None
        for _ in range(num_batches):
            batch = next(stream)
            batch_idx, epoch_idx, in_epoch = state.batches_trained, stream.epoch_idx, stream.batch_in_epoch
            if in_epoch == 0:
                self._open_epoch(epoch_idx, state)
            elif self._current_epoch is None:  # resumed mid-epoch: it was opened before the stop
                self._current_epoch = epoch_idx
            if epoch_len:
                context._start_known_batch(batch_idx, epoch_len)
            else:
                context._start_batch(batch_idx, None, epoch_idx=epoch_idx, batch_in_epoch=in_epoch)
            if to_device is not None and not (context.device == CPU and cpu_tensors(batch)):
                batch = to_device(batch)
            add_metrics(trial.train_batch(batch, epoch_idx, batch_idx))
            epoch_ended = in_epoch + 1 == epoch_len
            self._finish_batch(batch_idx, epoch_idx, epoch_ended)
            state.batches_trained += 1
            if epoch_ended:
                self._close_epoch(state)
            if should_stop():
                break

    def _open_epoch(self, epoch_idx: int, state: TrialState) -> None:
        """Start an epoch; a raw loader's shorter-than-len pass is closed here, when the next begins."""
        if self._current_epoch is not None:
            self._close_epoch(state)
        self._current_epoch = epoch_idx
        self._hooks.call("on_training_epoch_start", epoch_idx)

    def _close_epoch(self, state: TrialState) -> None:
        epoch_idx, self._current_epoch = self._current_epoch, None
        self._hooks.call("on_training_epoch_end", epoch_idx)
        state.epochs_trained += 1

    def _add_and_keep(self, output: Any) -> None:
        self._train_metrics.add(output)
        assert self._kept_batches is not None
        self._kept_batches.append({"loss": output} if isinstance(output, torch.Tensor) else dict(output))


def cpu_tensors(batch: Any) -> bool:
    """Whether ``batch`` is a tuple or list of CPU tensors (what ``to_device`` returns unchanged on CPU)."""
    if type(batch) is not tuple and type(batch) is not list:
        return False
    for item in batch:  # noqa: SIM110 - a plain loop: no generator object per batch
        if not isinstance(item, torch.Tensor) or not item.is_cpu:
            return False
    return True
