"""``DeepSpeedTrialContext``: what a DeepSpeedTrial uses to build (``zero_init``) and register its engines
and its model-parallel layout (reducers, ``to_device``, TensorBoard and the stop flag come from ``TrialServices``)."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any

from determined_trials._trial_context import TrialContext, TrialIdentity
from determined_trials.deepspeed._config import read_deepspeed_config
from determined_trials.deepspeed._mpu import ModelParallelUnit, make_data_parallel_mpu, make_deepspeed_mpu
from determined_trials.errors import ConfigError
from determined_trials.pytorch import TrialServices
from determined_trials.pytorch.device import default_device

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from determined_trials.core import Context

__all__ = ["DeepSpeedTrialContext"]

logger = logging.getLogger("determined_trials.deepspeed")


class DeepSpeedTrialContext(TrialContext, TrialServices):
    """The context a `DeepSpeedTrial` receives: wrap engines, set the MPU, move data, log.

    Built by `det.deepspeed.init()`. Without `core_context` (`from_config`, for debugging) the job
    has one process, torch.distributed is started for it, and TensorBoard files go to a temporary folder.
    """

    def __init__(
        self,
        *,
        core_context: Context | None = None,
        enable_tensorboard_logging: bool = True,
        **identity: Unpack[TrialIdentity],
    ) -> None:
        self._init_identity(core_context, identity)
        if core_context is None:
            from determined_trials.deepspeed._distributed import start_deepspeed_distributed

            start_deepspeed_distributed()  # from_config: deepspeed.initialize needs a process group
        dist = self.distributed
        self._init_services(core_context, enable_tensorboard_logging,
                            default_device(dist.get_local_rank(), dist.get_size()))
        self.models: list[Any] = []
        self._mpu = make_data_parallel_mpu(dist.get_rank(), dist.get_size())
        self._mpu_given = False
        self._micro_batch_size: int | None = None
        self._num_micro_batches: int | None = None
        self._auto_grad_accumulation = True
        self._dataset_checks = True
        self._use_pipeline_parallel = False

    # -- engines and layout ---------------------------------------------------------------------

    def wrap_model_engine(self, model: Any) -> Any:
        """Register a DeepSpeed engine (for checkpoints and batch sizes) and return it.

        The first engine defines the micro-batch size and gradient accumulation steps; a
        `PipelineEngine` turns on pipeline mode and, first, sets the MPU from its grid.
        """
        import deepspeed
        from deepspeed.runtime.pipe.engine import PipelineEngine

        if not isinstance(model, deepspeed.DeepSpeedEngine):
            raise TypeError(f"wrap_model_engine takes the engine of deepspeed.initialize(), got "
                            f"{type(model).__qualname__}")
        if any(model is m for m in self.models):
            raise ValueError("this engine is already wrapped; call wrap_model_engine once per engine")
        model = model.to(self._device)
        micro, gas = int(model.train_micro_batch_size_per_gpu()), int(model.gradient_accumulation_steps())
        if not self.models:
            self._check_global_batch_size(int(model.train_batch_size()), micro, gas)
            self._micro_batch_size, self._num_micro_batches = micro, gas
            if isinstance(model, PipelineEngine):
                self._use_pipeline_parallel = True
                if not self._mpu_given:
                    self._mpu = make_deepspeed_mpu(model.grid)
        elif micro != self._micro_batch_size:
            logger.warning("engine %d has train_micro_batch_size_per_gpu %d, but the first engine's %d defines "
                           "the data loaders' batch size", len(self.models), micro, self._micro_batch_size)
        self.models.append(model)
        return model

    def _check_global_batch_size(self, train_batch_size: int, micro: int, gas: int) -> None:
        given = self.get_hparams().get("global_batch_size")
        if given is not None and given != train_batch_size:
            raise ConfigError(
                f"hyperparameter global_batch_size is {given} but the DeepSpeed engine's train_batch_size is "
                f"{train_batch_size} (train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps {gas} "
                "x data-parallel size); make them agree, e.g. overwrite_deepspeed_config(ds_config, "
                "{'train_batch_size': global_batch_size})"
            )

    def zero_init(self, ds_config: str | os.PathLike[str] | dict[str, Any],
                  **kwargs: Any) -> contextlib.AbstractContextManager[Any]:
        """``deepspeed.zero.Init`` for ``ds_config``: build the model inside it (``with context.zero_init(cfg):
        model = Net()``) and ZeRO stage 3 partitions each parameter over the ranks as it is created, so a
        model too big for one rank is never whole on any. A no-op for ZeRO stages 0-2 (the same trial code
        runs them). ``kwargs`` go to ``deepspeed.zero.Init`` (e.g. ``remote_device``)."""
        config = read_deepspeed_config(ds_config) if isinstance(ds_config, (str, os.PathLike)) else ds_config
        if int(config.get("zero_optimization", {}).get("stage", 0)) != 3:
            return contextlib.nullcontext()
        import deepspeed

        init: contextlib.AbstractContextManager[Any] = deepspeed.zero.Init(config_dict_or_path=config, **kwargs)
        return init

    def set_mpu(self, mpu: ModelParallelUnit) -> None:
        """Use a custom model-parallel layout (after the first `wrap_model_engine`, once)."""
        if not self.models:
            raise RuntimeError("Please call `wrap_model_engine` before setting the mpu.")
        if self._mpu_given:
            raise RuntimeError("Only one MPU can be passed to DeepSpeedTrialContext: set_mpu was already called.")
        if not isinstance(mpu, ModelParallelUnit):
            raise TypeError(f"set_mpu takes a det.deepspeed.ModelParallelUnit, got {type(mpu).__qualname__}")
        self._mpu, self._mpu_given = mpu, True

    @property
    def mpu(self) -> ModelParallelUnit:
        """The model-parallel layout in use."""
        return self._mpu

    @property
    def use_pipeline_parallel(self) -> bool:
        """Whether the first wrapped engine is a pipeline engine."""
        return self._use_pipeline_parallel

    def disable_auto_grad_accumulation(self) -> None:
        """Call `train_batch` once per batch: it runs all gradient_accumulation_steps micro-batches itself."""
        self._auto_grad_accumulation = False

    def disable_dataset_reproducibility_checks(self) -> None:
        """Accept data loaders that are not `det.pytorch.DataLoader`; their order and resume position are yours."""
        self._dataset_checks = False

    def get_train_micro_batch_size_per_gpu(self) -> int:
        """The first engine's train_micro_batch_size_per_gpu: the training loaders' batch size."""
        return self._require_engine(self._micro_batch_size, "get_train_micro_batch_size_per_gpu")

    def get_num_micro_batches_per_slot(self) -> int:
        """The first engine's gradient_accumulation_steps: micro-batches per batch and slot."""
        return self._require_engine(self._num_micro_batches, "get_num_micro_batches_per_slot")

    def _require_engine(self, value: int | None, what: str) -> int:
        if value is None:
            raise RuntimeError(f"{what}() is known once an engine is wrapped: call context.wrap_model_engine(engine) "
                               "first (in your trial's __init__)")
        return value
