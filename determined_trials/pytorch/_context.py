"""`PyTorchTrialContext`: what a PyTorchTrial uses to wrap its models, optimizers, LR schedulers,
scalers and reducers, to step with gradient aggregation and AMP, and to reach TensorBoard."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from determined_trials._trial_context import TrialContext, TrialIdentity
from determined_trials.config import ExperimentConfig
from determined_trials.errors import ConfigError
from determined_trials.pytorch._experimental import PyTorchExperimentalContext
from determined_trials.pytorch._services import TrialServices
from determined_trials.pytorch.device import (
    default_autocast_dtype,
    default_device,
    install_autocast_forward,
    make_autocast,
    needs_scaler,
)
from determined_trials.pytorch.optim import LRScheduler, check_params_wrapped
from determined_trials.pytorch.optim import step_optimizer as run_optimizer_step
from determined_trials.pytorch.parallel import (
    MeshLayout,
    build_device_mesh,
    check_fsdp_model,
    check_model_mix,
    check_tp_divides,
    has_dtensor_params,
    plain_module,
    set_fsdp_grad_sync,
    set_grad_sync,
    torch_distributed_ready,
    unwrap,
    wrap_ddp,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from determined_trials.core import Context, DistributedContext

__all__ = ["PyTorchTrialContext"]

logger = logging.getLogger("determined_trials.pytorch")

_M = TypeVar("_M", bound=torch.nn.Module)
_O = TypeVar("_O", bound=torch.optim.Optimizer)


class PyTorchTrialContext(TrialContext, TrialServices):
    """The context a `PyTorchTrial` receives: wrap what you train, step, and log.

    Built by `det.pytorch.init()` / the trainer. Without `core_context` (e.g. `from_config`, for
    debugging) the job has one process and TensorBoard files go to a temporary folder.
    """

    _takes_mesh = True

    def __init__(
        self,
        *,
        core_context: Context | None = None,
        aggregation_frequency: int = 1,
        enable_tensorboard_logging: bool = True,
        device: torch.device | str | None = None,
        **identity: Unpack[TrialIdentity],
    ) -> None:
        self._init_identity(core_context, identity)
        self._aggregation_frequency = _resolve_aggregation(aggregation_frequency, self.config)
        self._average_grads: dict[int, bool] = {}
        dist = self.distributed
        chosen = torch.device(device) if device is not None else default_device(dist.get_local_rank(), dist.get_size())
        self._init_services(core_context, enable_tensorboard_logging, chosen)
        self._mesh_layout = _mesh_layout(self.config, dist)
        self._device_mesh: Any = None
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_schedulers: list[LRScheduler] = []
        self.scalers: list[Any] = []
        self.experimental = PyTorchExperimentalContext(self)
        self._amp_dtype: torch.dtype | None = None
        self._auto_scaler: Any = None
        self._auto_scaler_stepped = False
        self._optimizer_stepped_this_batch = False
        self._restore_grads: Any = None  # accumulated FSDP2 gradients of a checkpoint, for the next backward

    # -- wrapping -------------------------------------------------------------------------------

    def wrap_model(self, model: _M) -> _M:
        """Move `model` to `device`, register it for checkpointing and return the model to call.

        With several processes (torch.distributed initialised) the result is a DDP wrapper whose
        unknown attributes come from `model`; an FSDP2 model (`fully_shard` on its blocks and root)
        is returned as is: it shards and synchronises itself, and is checkpointed through DCP.
        """
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"wrap_model takes a torch.nn.Module, got {type(model).__qualname__}")
        if any(model is m or model is unwrap(m) for m in self.models):
            raise ValueError("this model is already wrapped; call wrap_model once per model")
        fsdp = check_fsdp_model(model)
        if has_dtensor_params(model):  # a tensor-parallel plan (with or without fully_shard): no DDP
            self._check_tensor_parallel(model, fsdp)
            fsdp = True
        check_model_mix([*self.models, model], self.distributed.get_size())
        if not fsdp:  # an FSDP2 model stays where fully_shard put its shards
            model = model.to(self._device)
        if self._amp_dtype is not None:
            install_autocast_forward(model, self._device, self._amp_dtype)
        wrapped: torch.nn.Module = model
        trainable = any(p.requires_grad for p in model.parameters())
        if self.distributed.get_size() > 1 and trainable and not fsdp:
            if not torch_distributed_ready():
                raise RuntimeError(
                    f"the job has {self.distributed.get_size()} processes but torch.distributed is not "
                    "initialised, so gradients would not be synchronised. Fix: launch with "
                    "`python -m determined_trials.launch.torch_distributed`, or call "
                    "torch.distributed.init_process_group() before det.pytorch.init()"
                )
            wrapped = wrap_ddp(model, self._device)
        self.models.append(wrapped)
        return wrapped  # type: ignore[return-value]  # a DDPModel that forwards to the model

    def get_device_mesh(self) -> Any:
        """The job's ``torch.distributed.device_mesh.DeviceMesh`` (made once), dimensions ``dp_replicate``,
        ``dp_shard`` and ``tp`` with the sizes of ``resources.mesh`` (default: ``dp_shard`` over every process;
        size 1 allowed). Shard with ``fully_shard(model, mesh=mesh["dp_shard"])`` (HSDP:
        ``mesh["dp_replicate", "dp_shard"]``) after ``parallelize_module(model, mesh["tp"], plan)``."""
        if self._device_mesh is None:
            if not torch_distributed_ready():
                raise RuntimeError(
                    "get_device_mesh needs torch.distributed, which is not initialised in this process. Fix: "
                    "launch with `python -m determined_trials.launch.torch_distributed` (or build the model "
                    "unsharded when torch.distributed.is_initialized() is False, e.g. in one process)"
                )
            self._device_mesh = build_device_mesh(self._mesh_layout, self._device)
        return self._device_mesh

    def _check_tensor_parallel(self, model: torch.nn.Module, fsdp: bool) -> None:
        """A model with DTensor parameters: ``tp`` divides what the plan shards, and several data-parallel
        ranks need ``fully_shard`` (nothing else synchronises their gradients)."""
        check_tp_divides(model)
        if not fsdp and self._mesh_layout.dp_size > 1:
            raise TypeError(
                f"wrap_model got a tensor-parallel model (DTensor parameters) without fully_shard, on "
                f"{self._mesh_layout.dp_size} data-parallel ranks: their gradients would not be synchronised. "
                'Fix: fully_shard(model, mesh=context.get_device_mesh()["dp_shard"]) after parallelize_module'
            )

    def wrap_optimizer(
        self,
        optimizer: _O,
        backward_passes_per_step: int = 1,
        fp16_compression: bool | None = None,
        average_aggregated_gradients: bool | None = None,
    ) -> _O:
        """Register `optimizer` (built on wrapped models' parameters) and return it.

        `backward_passes_per_step` and `fp16_compression` are Horovod settings, accepted for
        ported code; DDP synchronises every backward outside `no_sync`. `average_aggregated_
        gradients` overrides `optimizations.average_aggregated_gradients` for this optimizer.
        """
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"wrap_optimizer takes a torch.optim.Optimizer, got {type(optimizer).__qualname__}")
        if any(optimizer is o for o in self.optimizers):
            raise ValueError("this optimizer is already wrapped; call wrap_optimizer once per optimizer")
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
                or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")
        if fp16_compression:
            logger.warning("wrap_optimizer(fp16_compression=True) is a Horovod setting; ignored with DDP")
        check_params_wrapped(optimizer, self.models)
        average = self.config.optimizations.average_aggregated_gradients
        if average_aggregated_gradients is not None:
            average = bool(average_aggregated_gradients)
        self._average_grads[id(optimizer)] = average
        self.optimizers.append(optimizer)
        return optimizer

    def wrap_lr_scheduler(self, lr_scheduler: Any, step_mode: Any, frequency: int = 1) -> Any:
        """Register an LR scheduler of a wrapped optimizer; returns `scheduler` itself.

        `step_mode` is an `LRScheduler.StepMode`; the trainer steps it (unless MANUAL_STEP) and
        checkpoints it.
        """
        scheduler = lr_scheduler
        wrapper = LRScheduler(scheduler, step_mode, frequency)  # checks the mode and the scheduler
        optimizer = getattr(scheduler, "optimizer", None)
        if optimizer is None or not any(optimizer is o for o in self.optimizers):
            raise ValueError(
                "wrap_lr_scheduler: the scheduler's optimizer was not wrapped. Fix: "
                "optimizer = context.wrap_optimizer(optimizer) first, then build the scheduler on it"
            )
        self.lr_schedulers.append(wrapper)
        return scheduler

    def wrap_scaler(self, scaler: Any) -> Any:
        """Register a `torch.amp.GradScaler` for checkpointing; pass it to `step_optimizer(scaler=)`
        and call `scaler.update()` after stepping. Returns `scaler`."""
        missing = [name for name in ("scale", "unscale_", "step", "update", "state_dict") if not hasattr(scaler, name)]
        if missing:
            raise TypeError(f"wrap_scaler takes a torch.amp.GradScaler; {type(scaler).__qualname__} lacks {missing}")
        if self._auto_scaler is not None:
            raise ValueError("experimental.use_amp() already manages a GradScaler; do not wrap another")
        if any(scaler is s for s in self.scalers):
            raise ValueError("this scaler is already wrapped; call wrap_scaler once")
        self.scalers.append(scaler)
        return scaler

    # -- stepping -------------------------------------------------------------------------------

    def backward(
        self,
        loss: torch.Tensor,
        gradient: torch.Tensor | None = None,
        retain_graph: bool = False,
        create_graph: bool = False,
    ) -> None:
        """`loss.backward(...)`, scaled under automatic AMP.

        On batches that only accumulate gradients (aggregation_frequency > 1) DDP does not
        all-reduce: `_start_batch` turns DDP's gradient sync off for the whole batch, as
        `no_sync()` would, since DDP decides in the forward pass.
        """
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"backward takes the loss tensor, got {type(loss).__qualname__}")
        if self._auto_scaler is not None:
            loss = self._auto_scaler.scale(loss)
        if self._restore_grads is not None:
            from determined_trials.pytorch.parallel import apply_restored_grads

            apply_restored_grads(self._restore_grads)
            self._restore_grads = None
        if gradient is None and not retain_graph and not create_graph:
            loss.backward()  # torch's defaults: no keyword arguments to match on every call
        else:
            loss.backward(gradient=gradient, retain_graph=retain_graph, create_graph=create_graph)

    def step_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        clip_grads: Callable[[list[torch.Tensor]], Any] | None = None,
        auto_zero_grads: bool = True,
        scaler: Any = None,
    ) -> None:
        """Step `optimizer` on every `aggregation_frequency`-th batch (gradients accumulate in
        between and are averaged if so configured); `clip_grads(params)` runs first, on
        unscaled gradients; with `scaler` (or automatic AMP) the step goes through the scaler."""
        if (clip_grads is None and scaler is None and auto_zero_grads and self._aggregation_frequency == 1
                and self._auto_scaler is None and id(optimizer) in self._average_grads):
            optimizer.step()  # the common case, without the general path's per-call checks (same effect)
            optimizer.zero_grad()
            self._optimizer_stepped_this_batch = True
            return
        if id(optimizer) not in self._average_grads:  # filled by wrap_optimizer
            raise ValueError("step_optimizer: this optimizer was not wrapped; use context.wrap_optimizer(optimizer)")
        if self._aggregation_frequency > 1 and not auto_zero_grads:
            raise ValueError(
                f"auto_zero_grads=False cannot be combined with aggregation_frequency="
                f"{self._aggregation_frequency}: the harness zeroes gradients after each aggregated step. "
                "Fix: leave auto_zero_grads=True (do not call zero_grad yourself)"
            )
        if clip_grads is not None and not callable(clip_grads):
            raise TypeError(f"clip_grads must be a function of the parameters, got {clip_grads!r}")
        if scaler is not None and not any(scaler is s for s in self.scalers):
            raise ValueError("step_optimizer: this scaler was not wrapped; use context.wrap_scaler(scaler)")
        if not self._is_update_batch():
            return
        use_scaler = scaler if scaler is not None else self._auto_scaler
        run_optimizer_step(
            optimizer, aggregation=self._aggregation_frequency, average=self._average_grads[id(optimizer)],
            clip_grads=clip_grads, scaler=use_scaler, auto_zero_grads=auto_zero_grads,
        )
        self._optimizer_stepped_this_batch = True
        if use_scaler is not None and use_scaler is self._auto_scaler:
            self._auto_scaler_stepped = True

    def _is_update_batch(self) -> bool:
        """Whether optimizers step on the current batch: (batch_idx + 1) % aggregation_frequency == 0."""
        if self._aggregation_frequency == 1:
            return True
        return (self._require_batch_idx("step_optimizer/backward with aggregation") + 1) \
            % self._aggregation_frequency == 0

    def _start_batch(self) -> None:
        """Trainer hook, before each training batch (its index already on the clock): clear per-batch flags
        and, with gradient aggregation, turn DDP's and FSDP2's gradient sync on or off for the batch."""
        self._optimizer_stepped_this_batch = False
        if self._aggregation_frequency > 1:
            sync = self._is_update_batch()
            set_grad_sync(self.models, sync)
            set_fsdp_grad_sync(self.models, sync)

    def _end_batch(self) -> None:
        """Trainer hook, after each training batch: update the automatic AMP scaler if it stepped."""
        if self._auto_scaler_stepped:
            self._auto_scaler.update()
            self._auto_scaler_stepped = False

    # -- devices and AMP ------------------------------------------------------------------------

    def autocast(self, dtype: torch.dtype | None = None, enabled: bool = True) -> torch.autocast:
        """`torch.autocast` on this device: float16 on CUDA, bfloat16 on the CPU, unless `dtype`.

        float16 gradients need a scaler (`wrap_scaler`); `experimental.use_amp()` manages one."""
        return make_autocast(self._device, dtype, enabled)

    def _use_amp(self, dtype: torch.dtype | None) -> None:
        chosen = default_autocast_dtype(self._device) if dtype is None else dtype
        make_autocast(self._device, chosen, True)  # validates the dtype
        if self._amp_dtype is not None:
            if chosen != self._amp_dtype:
                raise ValueError(f"use_amp() was already called with {self._amp_dtype}; call it once")
            return
        if needs_scaler(chosen):
            if self.scalers:
                raise ValueError(
                    "use_amp() creates and manages its own GradScaler but one was wrapped with wrap_scaler; "
                    "use one or the other"
                )
            self._auto_scaler = torch.amp.GradScaler(self._device.type)
            self.scalers.append(self._auto_scaler)
        self._amp_dtype = chosen
        for model in self.models:
            install_autocast_forward(unwrap(model), self._device, chosen)

    # -- trainer state, TensorBoard, profiler ---------------------------------------------------

    def _inner_models(self) -> list[torch.nn.Module]:
        """The user's modules (DDP and torch.compile wrappers removed), e.g. for state dicts with plain keys."""
        return [plain_module(model) for model in self.models]


def _mesh_layout(config: ExperimentConfig, dist: DistributedContext) -> MeshLayout:
    """This process's place in ``resources.mesh`` (default: one ``dp_shard`` dimension over every process); one
    process is a mesh of one. Raises when a job of several processes is not the mesh's size."""
    size, rank, mesh = dist.get_size(), dist.get_rank(), config.resources.mesh
    if mesh is None or size == 1:
        return MeshLayout(1, size, 1, rank)
    replicate, shard, tp = mesh.shape
    if replicate * shard * tp != size:
        raise ConfigError(
            f"resources.mesh (dp_replicate {replicate} x dp_shard {shard} x tp {tp}) has {replicate * shard * tp} "
            f"ranks but this job has {size} processes. Fix: launch slots_per_trial = {replicate * shard * tp} "
            "processes, or change the mesh"
        )
    return MeshLayout(replicate, shard, tp, rank)


def _resolve_aggregation(argument: int, config: ExperimentConfig) -> int:
    if isinstance(argument, bool) or not isinstance(argument, int) or argument < 1:
        raise ValueError(f"aggregation_frequency must be an int >= 1, got {argument!r}")
    configured = config.optimizations.aggregation_frequency
    if argument != 1 and configured != 1 and argument != configured:
        raise ConfigError(
            f"aggregation_frequency={argument} was passed but the config sets "
            f"optimizations.aggregation_frequency: {configured}; set it in one place"
        )
    return argument if argument != 1 else configured
