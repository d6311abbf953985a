"""The PyTorch adapter's "train n batches": a tight loop over runs of batches inside one epoch of a sized
dataset, and a batch-at-a-time loop for raw loaders and streams (whose passes decide where epochs end).
Both report their batches to the loop's clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from determined_trials.loop import Clock, StopCheck
from determined_trials.pytorch.data import TrainingBatches, TrainingStream
from determined_trials.pytorch.metrics import TrainingMetrics

if TYPE_CHECKING:
    from determined_trials.pytorch._context import PyTorchTrialContext
    from determined_trials.pytorch._trial import PyTorchTrial

__all__ = ["CPU", "BatchLoop", "cpu_tensors"]

CPU = torch.device("cpu")


class BatchLoop:
    """Mixin of the PyTorch adapter: ``train``, reporting its batches to the loop's clock (which calls the
    epoch hooks)."""

    _trial: PyTorchTrial
    _context: PyTorchTrialContext
    _stream: TrainingBatches | None
    _train_metrics: TrainingMetrics
    _kept_batches: list[Any] | None
    _after_first_batch: Callable[[], None] | None  # run once, after this process's first batch
    _data_wait_s: float = 0.0  # getting the loader's iterator at a run's start (its workers, at an epoch's start)

    def take_data_wait(self) -> float:
        """Seconds spent getting the data loader's iterator since the last call (the loop's ``data_wait``: timed
        once per run of batches, at its start; a wait for a later batch is not timed, which would cost a clock
        read per batch)."""
        waited, self._data_wait_s = self._data_wait_s, 0.0
        return waited

    def train(self, num_batches: int, clock: Clock, should_stop: StopCheck) -> None:
        assert self._stream is not None, "start_training() first"
        if self._stream.epochs_from_passes:  # a raw loader or a stream: its epochs end when a pass does
            if self._after_first_batch is not None:
                self._train_passes(1, clock, should_stop)
                self._first_batch_done()
                num_batches -= 1
            self._train_passes(num_batches, clock, should_stop)
            return
        remaining = num_batches
        while remaining > 0:
            first = self._after_first_batch is not None
            trained, stopped = self._train_run(1 if first else remaining, clock, should_stop)
            remaining -= trained
            if first and trained:
                self._first_batch_done()
            if stopped:
                return

    def _first_batch_done(self) -> None:
        hook, self._after_first_batch = self._after_first_batch, None
        assert hook is not None
        hook()

    def _train_run(self, limit: int, clock: Clock, should_stop: StopCheck) -> tuple[int, bool]:
        """Train up to ``limit`` batches of the current epoch in one tight loop: (batches trained, stopped).

        Per batch only what every batch needs runs: take the batch, move the clock's ``batch_idx``,
        ``train_batch``, keep the loss on the device, the stop check. The rest (LR schedulers, function
        reducers, the AMP scaler, gradient aggregation, the profiler, kept outputs) runs only when the trial
        uses it.
        """
        context, stream, metrics = self._context, self._stream, self._train_metrics
        assert isinstance(stream, TrainingStream)
        epoch_idx, in_epoch, count = clock.begin(limit)
        first = clock.batches_trained
        sink = metrics.loss_sink() if self._kept_batches is None else None
        losses = None if sink is None else sink[0]
        count = min(count, sink[1]) if sink is not None else 1  # the first output sets the sink up
        add = self._add_and_keep if self._kept_batches is not None else metrics.add
        per_batch = self._needs_per_batch_steps()
        move = context.to_device if context.experimental._auto_to_device else None
        # on a CPU trial, a run whose first batch holds CPU tensors needs no move (to_device returns them)
        check_first = move is not None and context.device == CPU
        began = time.perf_counter()
        train_batch, iterator, tensor_type = self._trial.train_batch, stream.loader_iterator(), torch.Tensor
        self._data_wait_s += time.perf_counter() - began
        last_of_epoch = first - in_epoch + stream.epoch_len - 1
        preempt, decide = should_stop.local_preempt, should_stop.decide
        trained = kept = 0
        stopped = finished = False
        try:
            for batch_idx in range(first, first + count):
                batch = next(iterator)
                clock.batch_idx = batch_idx
                if per_batch:
                    context._start_batch()
                if check_first:
                    check_first = False
                    if cpu_tensors(batch):
                        move = None
                if move is not None:
                    batch = move(batch)
                output = train_batch(batch, epoch_idx, batch_idx)
                if losses is not None and type(output) is tensor_type:
                    losses.append(output.detach())
                    kept += 1
                else:
                    add(output)
                if per_batch:
                    self._finish_batch(batch_idx, epoch_idx, batch_idx == last_of_epoch)
                trained += 1
                # one process: read the two flags here, call the check only when one is set
                if (preempt is None or preempt.signalled or context._stop_requested) and decide():
                    stopped = True
                    break
            finished = True
        finally:
            stream.advance(trained)
            clock.advance(trained, closes=finished)  # the epoch's end hooks only after a run that did not fail
            if kept:
                metrics.count_losses(kept)
        return trained, stopped

    def _needs_per_batch_steps(self) -> bool:
        """Whether each batch needs ``_start_batch``/``_finish_batch`` (else the clock's position alone)."""
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

    def _train_passes(self, num_batches: int, clock: Clock, should_stop: StopCheck) -> None:
        """``train`` over a stream whose passes decide the epochs (a raw loader, an ``IterableDataset``), one
        batch at a time."""
        context, trial, stream = self._context, self._trial, self._stream
        assert stream is not None
        add_metrics = self._add_and_keep if self._kept_batches is not None else self._train_metrics.add
        to_device = context.to_device if context.experimental._auto_to_device else None
        for _ in range(num_batches):
            batch = next(stream)
            epoch_idx = stream.epoch_idx
            clock.begin_pass(epoch_idx, stream.batch_in_epoch)  # a shorter pass is closed when the next begins
            batch_idx = clock.batches_trained
            context._start_batch()
            if to_device is not None and not (context.device == CPU and cpu_tensors(batch)):
                batch = to_device(batch)
            add_metrics(trial.train_batch(batch, epoch_idx, batch_idx))
            self._finish_batch(batch_idx, epoch_idx, clock.at_epoch_end())
            clock.advance(1)
            if should_stop():
                break

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
