"""The PyTorch adapter: the loop's "train n batches", "evaluate", "save" and "load" for a PyTorchTrial.

The per-batch path does no host sync, no pickling, no logging and no collective beyond the
stop check (a flag on one process, one small broadcast with several): metrics stay on the device
until ``training_metrics()`` at the boundary, which does one host transfer and one allgather.
"""

from __future__ import annotations

import concurrent.futures
import logging
from pathlib import Path
from typing import Any

import torch

from determined_trials.loop import (
    Clock,
    DataShape,
    HookRunner,
    SaveMode,
    TrialAdapter,
    allgather,
    reduce_across_ranks,
)
from determined_trials.pytorch._batch_loop import CPU, BatchLoop, cpu_tensors
from determined_trials.pytorch._callback import overrides_hook
from determined_trials.pytorch._context import PyTorchTrialContext
from determined_trials.pytorch._trial import PyTorchTrial, evaluate_takes_batch_idx
from determined_trials.pytorch.checkpoint import (
    HostBuffers,
    capture_rng,
    large_state_template,
    load_models,
    load_trial_state,
    read_state_file,
    save_trial_state,
    snapshot_trial_state,
    state_nbytes,
    write_trial_state,
)
from determined_trials.pytorch.data import (
    STREAM_POSITIONS,
    DataLoader,
    StreamOfPasses,
    StreamPositions,
    TrainingBatches,
    ValidationLoader,
    in_step,
    is_reproducible_loader,
    require_opt_out,
    wrap_raw_loader,
)
from determined_trials.pytorch.metrics import TrainingMetrics, ValidationMetrics
from determined_trials.pytorch.parallel import check_model_mix, has_dtensor_params, is_dcp_checkpoint, is_fsdp

__all__ = ["PyTorchAdapter"]

logger = logging.getLogger("determined_trials.pytorch")

class PyTorchAdapter(BatchLoop, TrialAdapter):
    """Runs one PyTorchTrial under the loop (its ``train`` is the BatchLoop's)."""

    framework = f"torch-{torch.__version__}"

    def __init__(self, trial: PyTorchTrial, context: PyTorchTrialContext, hooks: HookRunner) -> None:
        self._trial = trial
        self._context = context
        self._hooks = hooks
        self._dist = context.distributed
        self._stream: TrainingBatches | None = None
        self._validation_loader: Any = None
        self._train_metrics = TrainingMetrics()
        self._uses_evaluate_batch = type(trial).evaluate_batch is not PyTorchTrial.evaluate_batch
        self._evaluate_takes_batch_idx = self._uses_evaluate_batch and evaluate_takes_batch_idx(trial)
        callbacks = list(hooks.callbacks.values())
        self._keep_outputs = overrides_hook(callbacks, "on_validation_epoch_end")
        self._kept_batches: list[Any] | None = (
            [] if any(getattr(cb, "wants_batch_metrics", False) for cb in callbacks) else None
        )
        self._batch_metrics: list[dict[str, Any]] = []
        self._host_buffers = HostBuffers()
        self._after_first_batch = self._prepare_host_buffers
        self._check_wrapped()
        # FSDP2 or a tensor-parallel plan (DTensors): every rank saves its shard (save_mode)
        self._sharded = any(is_fsdp(m) or has_dtensor_params(m) for m in context.models)
        self._layout = context._mesh_layout  # data over the data-parallel ranks; metrics from tp rank 0
        self._validation_checked = False
        self._positions = StreamPositions()  # a stream's per-rank positions, saved among the callbacks' state
        self._rank_rngs: list[Any] | None = None  # every rank's RNG states, gathered before each checkpoint

    # -- the adapter interface -----------------------------------------------------------------

    def load(self, path: Path) -> None:
        self._hooks.callbacks[STREAM_POSITIONS] = self._positions  # picks a stream's position up, if saved
        if self._sharded or is_dcp_checkpoint(path):
            from determined_trials.pytorch.checkpoint import (
                load_sharded_state,  # torch.distributed.checkpoint: only when used
            )

            load_sharded_state(path, self._context, self._hooks)
        else:
            load_trial_state(path, self._context, self._hooks)

    def load_weights(self, path: Path) -> None:
        if self._sharded or is_dcp_checkpoint(path):
            from determined_trials.pytorch.checkpoint import load_model_weights  # torch.distributed.checkpoint

            load_model_weights(path, self._context.models)
        else:
            load_models(read_state_file(path), self._context.models, path)

    def _prepare_host_buffers(self) -> None:
        """After this process's first batch (the optimizer state exists by now): when it will take
        snapshots, start allocating their host buffers on a helper thread, so that not even the first
        checkpoint allocates them on the training thread."""
        if self._dist.get_rank() == 0 and self.save_mode is SaveMode.ASYNC_SNAPSHOT and self.wants_snapshot():
            self._host_buffers.prepare(large_state_template(self._context), self._context.device)

    def start_training(self, clock: Clock) -> DataShape:
        loader = self._trial.build_training_data_loader()
        size, rank = self._layout.dp_size, self._layout.dp_rank  # a tensor-parallel group reads one batch
        stream: TrainingBatches
        if isinstance(loader, DataLoader):
            stream = loader.build_training_stream(
                seed=self._context.get_trial_seed(), rank=rank, num_replicas=size, start_batch=clock.batches_trained,
            )
            global_batch = (loader.batch_size or 0) * size or None
        else:
            self._require_opt_out(loader, "build_training_data_loader")
            stream = wrap_raw_loader(loader, start_batch=clock.batches_trained)
            global_batch = _raw_batch_size(loader, size)
        self._stream = stream
        self._context._read_clock(clock.view)
        if isinstance(stream, StreamOfPasses):
            self._check_stream_units()
            self._hooks.callbacks[STREAM_POSITIONS] = self._positions
            self._positions.resume(stream, rank, size)
        else:
            self._hooks.callbacks.pop(STREAM_POSITIONS, None)
        if self._sharded and self._dist.get_size() > 1:  # made once here, not in the first checkpoint's time
            from determined_trials.pytorch.checkpoint import checkpoint_group

            checkpoint_group()
        self._context.reducers.reset(True)
        self._train_metrics.reset()
        return DataShape(stream.epoch_len, global_batch)

    def _check_stream_units(self) -> None:
        """A stream has no epoch length: an LR scheduler stepped per epoch would never step."""
        per_epoch = [s for s in self._context.lr_schedulers if s.step_mode is s.StepMode.STEP_EVERY_EPOCH]
        if per_epoch:
            raise ValueError(
                "the training data is a stream (an IterableDataset), which has no epoch length, but an LR scheduler "
                "is wrapped with step_mode=STEP_EVERY_EPOCH: wrap it with LRScheduler.StepMode.STEP_EVERY_BATCH "
                "(and a schedule counted in batches) instead"
            )

    def prepare_checkpoint(self) -> None:
        """On every rank before a checkpoint, in one allgather: the ranks' stream positions (on a stream) and,
        on several ranks unless FSDP2 saves them per rank, their RNG states (which drift apart when the ranks
        draw different amounts, e.g. dropout over batches of different sizes)."""
        stream = self._stream if isinstance(self._stream, StreamOfPasses) else None
        rngs = self._dist.get_size() > 1 and not self._sharded
        if stream is None and not rngs:
            return
        gathered = allgather(self._dist, (stream.state_dict() if stream is not None else None,
                                          capture_rng() if rngs else None))
        if stream is not None:  # a data-parallel group's position once (its tp ranks read the same batches)
            tp = self._layout.tp
            self._positions.ranks = [position for i, (position, _) in enumerate(gathered) if i % tp == 0]
        self._rank_rngs = [rng for _, rng in gathered] if rngs else None

    def batch_metrics(self) -> list[dict[str, Any]]:
        """The last workload's per-batch metrics, averaged across ranks; [] unless a callback opted in."""
        return self._batch_metrics

    def stop_requested(self) -> bool:
        return self._context._stop_requested  # read every batch: the attribute, not the getter

    def training_metrics(self) -> dict[str, Any]:
        reducers = self._context.reducers
        kept = self._kept_batches
        if kept is None and self._dist.get_size() == 1 and not reducers.has_reducers(True):
            loss = self._train_metrics.local_loss_mean()  # the common case, in fewer steps
            if loss is not None:
                self._train_metrics.reset()
                return loss
        per_batch = None if kept is None else [{k: _to_python(v) for k, v in out.items()} for out in kept]
        metrics, per_rank = reduce_across_ranks(self._dist, self._train_metrics, reducers, True, extra=per_batch,
                                                reports=self._layout.reports)
        if kept is not None:
            self._batch_metrics = _average_batches(per_rank)
            kept.clear()
        self._train_metrics.reset()
        reducers.reset(True)
        return metrics

    def validate(self, *, test_mode: bool = False) -> dict[str, Any]:
        models = self._context.models
        for model in models:
            model.eval()
        self._context.reducers.reset(False)
        try:
            with torch.no_grad():
                if self._uses_evaluate_batch:
                    return self._evaluate_batches(test_mode)
                metrics = self._evaluate_full_dataset()
                metrics.update(self._context.reduce_metrics(False))
                return metrics
        finally:
            for model in models:
                model.train()
            self._context.reducers.reset(True)  # updates made while validating are not training's

    def save(self, path: Path) -> None:
        if self._sharded:
            from determined_trials.pytorch.checkpoint import save_sharded_state

            save_sharded_state(path, self._trial, self._context, self._hooks)
        elif self._host_buffers.pinned:  # the last checkpoint of a GPU state: pinned copies beat torch.save's
            save_trial_state(path, self._trial, self._context, self._hooks, self.snapshot())
        else:
            save_trial_state(path, self._trial, self._context, self._hooks, rank_rngs=self._rank_rngs)

    def start_sharded_save(self, path: Path) -> concurrent.futures.Future[Any]:
        """On every rank (FSDP2): start writing this rank's shard into ``path`` in the background
        (``dcp.async_save``); returns a future the loop waits for before it publishes the checkpoint."""
        from determined_trials.pytorch.checkpoint import checkpoint_group, start_sharded_save

        group = checkpoint_group() if self._dist.get_size() > 1 else None
        return start_sharded_save(path, self._trial, self._context, self._hooks, group,
                                       lambda ok: all(allgather(self._dist, ok)))

    @property
    def save_mode(self) -> SaveMode:
        """FSDP2 models: every rank saves its shard (``ASYNC_SHARDED`` or ``SHARDED``); else the chief
        (``ASYNC_SNAPSHOT`` or ``SYNC_CHIEF``); in the background unless ``async_save`` is False."""
        if self._sharded:
            return SaveMode.ASYNC_SHARDED if self.async_save else SaveMode.SHARDED
        return SaveMode.ASYNC_SNAPSHOT if self.async_save else SaveMode.SYNC_CHIEF

    @property
    def async_save(self) -> bool:
        """Checkpoints are written in the background unless disabled, or a callback has
        ``on_checkpoint_write_end`` or the deprecated ``on_checkpoint_end`` (either may add files before
        publishing: it keeps the synchronous path)."""
        if not self._context.experimental._async_checkpoints:
            return False
        callbacks = self._hooks.callbacks.values()
        return not any(overrides_hook(callbacks, hook) for hook in ("on_checkpoint_write_end", "on_checkpoint_end"))

    def wants_snapshot(self) -> bool:
        """Whether the state is large enough to copy and serialise in the background (see
        ``context.experimental.set_checkpoint_snapshot_threshold``)."""
        threshold = self._context.experimental._snapshot_min_bytes
        return threshold == 0 or state_nbytes(self._context) >= threshold

    def snapshot(self) -> dict[str, Any]:
        """On the training thread: a host-memory copy of everything ``save`` writes, into the prepared
        host buffers or the previous snapshot's (the loop calls it only once that one is written)."""
        snapshot = snapshot_trial_state(self._trial, self._context, self._hooks, copy=True,
                                        reuse=self._host_buffers.take(), rank_rngs=self._rank_rngs)
        self._host_buffers.keep(snapshot["state"])
        return snapshot

    def write_snapshot(self, snapshot: dict[str, Any], path: Path) -> None:
        """On the checkpoint writer thread: serialise ``snapshot`` into ``path``."""
        write_trial_state(snapshot, path)

    def close(self) -> None:
        self._host_buffers.release()
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    # -- validation ----------------------------------------------------------------------------

    def _evaluate_batches(self, test_mode: bool) -> dict[str, Any]:
        loader = self._validation_data(sharded=True)
        if self._sharded and self._dist.get_size() > 1:
            if isinstance(loader, ValidationLoader) and loader.record_counts is None:  # a stream: parts may differ
                loader = in_step(loader, lambda mine: all(allgather(self._dist, mine)))
            elif not self._validation_checked:
                self._check_even_validation(loader)
        metrics = ValidationMetrics(self._trial.evaluation_reducer())
        with_idx = self._evaluate_takes_batch_idx
        to_device = self._context.to_device if self._context.experimental._auto_to_device else None
        check_first = to_device is not None and self._context.device == CPU
        reducers = self._context.reducers
        outputs: list[Any] = []
        self._hooks.call("on_validation_epoch_start")
        for batch_idx, batch in enumerate(loader):
            records = self._trial.get_batch_length(batch)
            if check_first:  # on a CPU trial, CPU tensors need no move (to_device returns them)
                check_first = False
                if cpu_tensors(batch):
                    to_device = None
            if to_device is not None:
                batch = to_device(batch)
            evaluate: Any = self._trial.evaluate_batch
            output = evaluate(batch, batch_idx) if with_idx else evaluate(batch)
            metrics.add(output, records)
            if self._keep_outputs:
                outputs.append(output)
            reducers.batch_end()
            if test_mode:
                break
        self._hooks.call("on_validation_epoch_end", outputs)
        return reduce_across_ranks(self._dist, metrics, reducers, False, reports=self._layout.reports)[0]

    def _check_even_validation(self, loader: Any) -> None:
        """FSDP2: every forward is a collective, so every rank must evaluate as many batches."""
        counts = allgather(self._dist, len(loader) if hasattr(loader, "__len__") else None)
        if len(set(counts)) > 1:
            raise ValueError(
                f"FSDP2 trial: the ranks' validation loaders hold {counts} batches; every forward pass of a sharded "
                "model is a collective, so each rank must evaluate as many batches. Fix: make the validation set "
                "split evenly (records divisible by batch_size x processes), e.g. drop or pad the last records"
            )
        self._validation_checked = True

    def _evaluate_full_dataset(self) -> dict[str, Any]:
        if self._sharded and self._dist.get_size() > 1:
            raise TypeError(
                "FSDP2 trial: evaluate_full_dataset runs on rank 0 alone, but a sharded model's forward needs every "
                "rank. Fix: implement evaluate_batch (the harness shards the validation data and reduces metrics)"
            )
        metrics: dict[str, Any] | None = None
        if self._dist.get_rank() == 0:
            result = self._trial.evaluate_full_dataset(self._validation_data(sharded=False))
            if not isinstance(result, dict):
                raise TypeError(f"evaluate_full_dataset() must return a dict of metrics, got {type(result).__name__}")
            metrics = {key: _to_python(value) for key, value in result.items()}
        if self._dist.get_size() > 1:
            metrics = self._dist.broadcast(metrics)
        assert metrics is not None
        return metrics

    def _validation_data(self, *, sharded: bool) -> Any:
        if self._validation_loader is None:
            loader: Any = self._trial.build_validation_data_loader()
            if isinstance(loader, DataLoader):
                rank, size = (self._layout.dp_rank, self._layout.dp_size) if sharded else (0, 1)
                seed = self._context.get_trial_seed()
                loader = loader.build_validation_loader(rank=rank, num_replicas=size, seed=seed)
            else:
                self._require_opt_out(loader, "build_validation_data_loader")
            self._validation_loader = loader
        return self._validation_loader

    # -- helpers -------------------------------------------------------------------------------

    def _check_wrapped(self) -> None:
        if not self._context.models:
            raise RuntimeError(
                f"{type(self._trial).__name__}.__init__ wrapped no model: call "
                "self.model = context.wrap_model(model) so the harness can checkpoint and move it"
            )
        if not self._context.optimizers:
            raise RuntimeError(
                f"{type(self._trial).__name__}.__init__ wrapped no optimizer: call "
                "self.optimizer = context.wrap_optimizer(optimizer) so the harness can checkpoint it"
            )
        check_model_mix(self._context.models, self._dist.get_size())

    def _require_opt_out(self, loader: Any, method: str) -> None:
        checks = self._context.experimental._dataset_checks
        if not checks and not is_reproducible_loader(loader) and self._dist.get_size() > 1:
            logger.warning("%s returned a raw loader: sharding it across ranks is up to you", method)
        require_opt_out(loader, method, checks, "context.experimental.disable_dataset_reproducibility_checks()")


def _average_batches(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Batch i's metrics averaged over the ranks that trained a batch i (numbers only; else rank 0's)."""
    longest = max((len(batches) for batches in per_rank), default=0)
    averaged = []
    for i in range(longest):
        present = [batches[i] for batches in per_rank if i < len(batches)]
        merged: dict[str, Any] = {}
        for key, first in present[0].items():
            values: list[Any] = [b.get(key) for b in present]
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            merged[key] = sum(values) / len(values) if numeric and len(values) > 1 else first
        averaged.append(merged)
    return averaged


def _raw_batch_size(loader: Any, size: int) -> int | None:
    batch_size = getattr(loader, "batch_size", None)
    return batch_size * size if isinstance(batch_size, int) else None


def _to_python(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()  # one element: a number
    if hasattr(value, "tolist"):
        return value.reshape(()).item() if getattr(value, "size", 0) == 1 else value.tolist()
    return value
