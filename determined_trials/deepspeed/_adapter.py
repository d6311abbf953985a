"""The DeepSpeed adapter: the loop's "train n batches", "evaluate", "save" and "load" for a DeepSpeedTrial.

One batch is ``train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size``
records (the engine's ``train_batch_size``) and exactly one optimizer step. Metrics stay on the device
until the boundary (one host transfer, one allgather); only the ranks whose MPU reports metrics count.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import torch

from determined_trials.deepspeed._checkpoint import load_engine_weights, load_rank_state, save_rank_state
from determined_trials.deepspeed._context import DeepSpeedTrialContext
from determined_trials.deepspeed._data import (
    CountingIterator,
    batches_in,
    training_stream,
    validation_loader,
)
from determined_trials.deepspeed._trial import DeepSpeedTrial
from determined_trials.loop import (
    Clock,
    DataShape,
    HookRunner,
    SaveMode,
    StopCheck,
    TrialAdapter,
    allgather,
    reduce_across_ranks,
)
from determined_trials.pytorch.data import DataLoader, TrainingStream, require_opt_out
from determined_trials.pytorch.metrics import TrainingMetrics, ValidationMetrics

__all__ = ["DeepSpeedAdapter"]

logger = logging.getLogger("determined_trials.deepspeed")


class DeepSpeedAdapter(TrialAdapter):
    """Runs one DeepSpeedTrial under the loop; saves on every rank (``SaveMode.SHARDED``)."""

    save_mode = SaveMode.SHARDED

    def __init__(self, trial: DeepSpeedTrial, context: DeepSpeedTrialContext, hooks: HookRunner) -> None:
        import deepspeed

        if not context.models:
            raise RuntimeError(f"{type(trial).__name__}.__init__ wrapped no DeepSpeed engine: call "
                               "self.engine = context.wrap_model_engine(engine) so the harness can checkpoint it")
        self.framework = f"deepspeed-{deepspeed.__version__}"
        self._trial, self._context, self._hooks = trial, context, hooks
        self._dist = context.distributed
        self._mpu = context.mpu
        self._engine = context.models[0]
        self._gas = context.get_num_micro_batches_per_slot()
        self._calls = 1 if context.use_pipeline_parallel or not context._auto_grad_accumulation else self._gas
        self._stream: Any = None
        self._validation: Any = None
        self._validation_source: Any = None  # the trial's validation loader, unsharded
        self._zero3 = any(engine.zero_optimization_stage() == 3 for engine in context.models)
        self._train_metrics = TrainingMetrics()

    # -- the adapter interface -----------------------------------------------------------------

    def load(self, path: Path) -> None:
        load_rank_state(path, self._trial, self._context, self._hooks)

    def load_weights(self, path: Path) -> None:
        load_engine_weights(path, self._context)

    def start_training(self, clock: Clock) -> DataShape:
        epoch_len: int | None = None
        if self._mpu.should_build_data_loader:
            loader = self._trial.build_training_data_loader()
            require_opt_out(loader, "build_training_data_loader", self._context._dataset_checks)
            self._stream, epoch_len = training_stream(
                loader, seed=self._context.get_trial_seed(), rank=self._mpu.data_parallel_rank,
                size=self._mpu.data_parallel_world_size, start_batch=clock.batches_trained,
                micro_batches=self._gas, micro_batch_size=self._context.get_train_micro_batch_size_per_gpu(),
            )
        self._context._read_clock(clock.view)
        self._context.reducers.reset(True)
        self._train_metrics.reset()
        return DataShape(self._agree_on_epoch_len(epoch_len), int(self._engine.train_batch_size()))

    def _agree_on_epoch_len(self, mine: int | None) -> int:
        lengths = [n for n in allgather(self._dist, mine) if n is not None]
        if not lengths:
            raise RuntimeError(
                "no rank knows the epoch length: the training data loader has no len() (or no rank builds one); "
                "return a det.pytorch.DataLoader or a loader over a sized dataset"
            )
        if len(set(lengths)) > 1:
            logger.warning("ranks' training loaders have different epoch lengths %s; using the shortest", lengths)
        return min(lengths)

    def train(self, num_batches: int, clock: Clock, should_stop: StopCheck) -> None:
        context, trial, engine = self._context, self._trial, self._engine
        calls, stream = self._calls, self._stream
        counted = isinstance(stream, TrainingStream)  # a det.pytorch.DataLoader's stream counts micro-batches
        add_metrics, reducers = self._train_metrics.add, context.reducers
        reports, profiler = self._mpu.should_report_metrics, context._profiler
        for _ in range(num_batches):
            epoch_idx = clock.begin()[0]  # one batch; its epoch opens at its first batch
            batch_idx = clock.batches_trained
            steps, position = engine.global_steps, stream.position if counted else None
            for _ in range(calls):
                output = trial.train_batch(stream, epoch_idx, batch_idx)
                if reports:
                    add_metrics(output)
            self._check_batch(batch_idx, engine.global_steps - steps, position)
            reducers.batch_end()
            clock.advance()
            if profiler is not None:
                profiler.step()
            if should_stop():
                break

    def _check_batch(self, batch_idx: int, steps: int, position: int | None) -> None:
        """One batch must be exactly one optimizer step over exactly ``gas`` micro-batches."""
        if steps != 1:
            raise RuntimeError(
                f"batch {batch_idx}: the DeepSpeed engine took {steps} optimizer steps, expected exactly 1. One batch "
                f"is train_micro_batch_size_per_gpu ({self._context.get_train_micro_batch_size_per_gpu()}) x "
                f"gradient_accumulation_steps ({self._gas}) x data-parallel size "
                f"({self._mpu.data_parallel_world_size}) = {self._engine.train_batch_size()} records; "
                + ("train_batch is called once per micro-batch: call engine.backward(loss) and engine.step() in each"
                   if self._calls > 1 else
                   f"train_batch must run all {self._gas} micro-batches (engine.backward + engine.step each)")
            )
        if position is not None:
            taken = self._stream.position - position
            if taken != self._gas:
                raise RuntimeError(
                    f"batch {batch_idx}: train_batch took {taken} micro-batches from dataloader_iter, but one batch "
                    f"is gradient_accumulation_steps = {self._gas} micro-batches"
                    + (" (one per train_batch call)" if self._calls > 1 else "")
                )

    def stop_requested(self) -> bool:
        return self._context.get_stop_requested()

    def training_metrics(self) -> dict[str, Any]:
        reducers = self._context.reducers
        metrics = reduce_across_ranks(self._dist, self._train_metrics, reducers, True,
                                      reports=self._mpu.should_report_metrics)[0]
        self._train_metrics.reset()
        reducers.reset(True)
        return metrics

    def validate(self, *, test_mode: bool = False) -> dict[str, Any]:
        engines = self._context.models
        for engine in engines:
            engine.eval()
        self._context.reducers.reset(False)
        try:
            with torch.no_grad():
                return self._evaluate(test_mode)
        finally:
            for engine in engines:
                engine.train()
            self._context.reducers.reset(True)  # updates made while validating are not training's

    def save(self, path: Path) -> None:
        save_rank_state(path, self._trial, self._context, self._hooks)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        restore_functional_linear()

    # -- validation ----------------------------------------------------------------------------

    def _validation_data(self) -> Any:
        if self._validation is None and self._mpu.should_build_data_loader:
            loader = self._trial.build_validation_data_loader()
            require_opt_out(loader, "build_validation_data_loader", self._context._dataset_checks)
            self._validation_source = loader
            self._validation = validation_loader(loader, seed=self._context.get_trial_seed(),
                                                 rank=self._mpu.data_parallel_rank,
                                                 size=self._mpu.data_parallel_world_size)
        return self._validation

    def _num_calls(self, loader: Any) -> int | None:
        """evaluate_batch calls on this rank: one per batch; a pipeline's stages agree on whole GAS groups."""
        mine = batches_in(loader) if loader is not None else None
        if not self._context.use_pipeline_parallel:
            return mine
        counts = [n for n in allgather(self._dist, mine) if n is not None]
        if not counts or min(counts) < self._gas:
            raise RuntimeError(
                f"the validation loaders have {counts or 'no'} batches, fewer than gradient_accumulation_steps "
                f"({self._gas}): a pipeline engine's eval_batch takes that many micro-batches per call"
            )
        return min(counts) // self._gas

    def _lockstep_calls(self, loader: Any) -> int:
        """ZeRO-3 on several ranks: each forward gathers parameters from every rank, so every rank makes
        as many evaluate_batch calls as the rank with the most validation batches."""
        counts = allgather(self._dist, batches_in(loader) if loader is not None else 0)
        if None in counts:
            raise RuntimeError(
                f"ZeRO stage 3: the ranks' validation loaders hold {counts} batches (None: no len()); every "
                "forward pass is a collective, so the harness must know each rank's number of batches to keep the "
                "ranks in step: return a det.pytorch.DataLoader (or a loader with len()) from "
                "build_validation_data_loader"
            )
        return max(counts)

    def _padding(self) -> Any:
        """The batch a rank that had no validation batch at all repeats (the others repeat their last)."""
        if not isinstance(self._validation_source, DataLoader):
            raise RuntimeError(
                "ZeRO stage 3: this rank's validation loader holds no batch while another rank's holds some; "
                "every rank must run as many forward passes. Return a det.pytorch.DataLoader from "
                "build_validation_data_loader (the harness then pads with the first validation batch)"
            )
        whole = self._validation_source.build_validation_loader(rank=0, num_replicas=1,
                                                                seed=self._context.get_trial_seed())
        return next(iter(whole))

    def _evaluate(self, test_mode: bool) -> dict[str, Any]:
        loader = self._validation_data()
        lockstep = self._zero3 and self._dist.get_size() > 1 and not self._context.use_pipeline_parallel
        calls = self._lockstep_calls(loader) if lockstep else self._num_calls(loader)
        iterator: CountingIterator | None = None
        if lockstep:  # a rank whose batches ran out repeats one (padding), until every rank is done
            iterator = CountingIterator(loader if loader is not None else (), self._padding)
        elif loader is not None:
            iterator = CountingIterator(loader)
        metrics = ValidationMetrics(self._trial.evaluation_reducer())
        reports, reducers = self._mpu.should_report_metrics, self._context.reducers
        batch_idx = 0
        while calls is None or batch_idx < calls:
            try:
                output = self._trial.evaluate_batch(iterator, batch_idx)
            except StopIteration:
                if calls is not None:
                    raise
                break  # a raw loader without len ran out
            records = iterator.take_records() if iterator is not None else 0
            if reports and records is not None:  # None: a padding call (ZeRO-3), its metrics are dropped
                metrics.add(output, records)
            reducers.batch_end()
            batch_idx += 1
            if test_mode:
                break
        return reduce_across_ranks(self._dist, metrics, reducers, False, reports=reports)[0]


def restore_functional_linear() -> None:
    """Put torch's ``torch.nn.functional.linear`` back once a trial ends.

    A ZeRO-3 engine (and ``zero.Init``) replaces it for the whole process with DeepSpeed's memory-efficient
    version, which "persists unless manually reset": every later model of the process (another trial, a
    compiled model's autocast) would run DeepSpeed's autograd function instead of torch's op.
    """
    partition = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    if partition is None:  # no ZeRO-3 in this process
        return
    original = getattr(partition.InsertPostInitMethodToModuleSubClasses, "linear_bk", None)
    if original is not None and torch.nn.functional.linear is not original:
        torch.nn.functional.linear = original
