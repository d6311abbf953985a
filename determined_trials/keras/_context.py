"""``TFKerasTrialContext``: what a TFKerasTrial uses to wrap its model, optimizer and datasets, tune the
harness's ``fit`` settings and ask to stop."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from determined_trials._trial_context import TrialContext, TrialIdentity
from determined_trials.keras._backend import require_tensorflow_backend

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from determined_trials.core import Context

__all__ = ["FitSettings", "TFKerasTrialContext"]

keras = require_tensorflow_backend()
_UNSET: Any = object()


@dataclasses.dataclass
class FitSettings:
    """What ``configure_fit`` can change; ``verbose``, ``workers``, ``use_multiprocessing`` and
    ``max_queue_size`` are accepted for ported code and have no effect (data is read in this process)."""

    verbose: Any = 0
    class_weight: Mapping[int, float] | None = None
    workers: int = 0
    use_multiprocessing: bool = False
    max_queue_size: int = 10
    shuffle: bool = True
    validation_steps: int | None = None


class TFKerasTrialContext(TrialContext):
    """The context a ``TFKerasTrial`` receives. Built by ``det.keras.init()``; ``from_config`` (for
    debugging) gives one with a single process and no strategy."""

    def __init__(
        self,
        *,
        core_context: Context | None = None,
        strategy: Any = None,
        **identity: Unpack[TrialIdentity],
    ) -> None:
        self._init_identity(core_context, identity)
        self.strategy = strategy
        self.models: list[Any] = []
        self.optimizers: list[Any] = []
        self.fit_settings = FitSettings()
        self._wrapped_datasets: list[Any] = []

    def _close(self) -> None:
        """The trainer's hook at shutdown: a Keras context holds nothing to release."""

    # -- wrapping -------------------------------------------------------------------------------

    def wrap_model(self, model: Any) -> Any:
        """Register the Keras model (build it inside ``build_model``, then ``compile`` it); returns it."""
        if not isinstance(model, keras.Model):
            raise TypeError(f"wrap_model takes a keras.Model, got {type(model).__qualname__}")
        if self.models:
            same = any(model is m for m in self.models)
            raise ValueError("this model is already wrapped; call wrap_model once" if same else
                             "a TFKerasTrial trains one model: wrap_model was already called with another model")
        self.models.append(model)
        return model

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Register an optimizer (for ported code: the model's compiled optimizer is what trains and is
        checkpointed; under several workers gradients are all-reduced by the strategy). Returns it."""
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"wrap_optimizer takes a keras.optimizers.Optimizer, got {type(optimizer).__qualname__}")
        if not any(optimizer is o for o in self.optimizers):
            self.optimizers.append(optimizer)
        return optimizer

    def wrap_dataset(self, dataset: Any, shard_dataset: bool = True) -> Any:
        """Mark a ``tf.data.Dataset`` of per-slot batches as the harness's to feed; with several workers
        and ``shard_dataset`` each worker keeps every n-th batch (``dataset.shard``). Arrays and
        ``keras.utils.PyDataset`` are returned unchanged (the harness shards those itself)."""
        import tensorflow as tf

        if not isinstance(dataset, tf.data.Dataset):
            return dataset
        size = self.distributed.get_size()
        if shard_dataset and size > 1:
            dataset = dataset.shard(size, self.distributed.get_rank())
        self._wrapped_datasets.append(dataset)
        return dataset

    def _is_wrapped(self, dataset: Any) -> bool:
        return any(dataset is d for d in self._wrapped_datasets)

    def configure_fit(
        self, verbose: Any = _UNSET, class_weight: Any = _UNSET, workers: Any = _UNSET,
        use_multiprocessing: Any = _UNSET, max_queue_size: Any = _UNSET, shuffle: Any = _UNSET,
        validation_steps: Any = _UNSET,
    ) -> None:
        """Change the given ``fit`` settings (the others keep their values); see ``FitSettings``."""
        given = {k: v for k, v in locals().items() if k != "self" and v is not _UNSET}
        if "shuffle" in given and not isinstance(given["shuffle"], bool):
            raise TypeError(f"configure_fit(shuffle=...) takes True or False, got {given['shuffle']!r}")
        steps = given.get("validation_steps")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"configure_fit(validation_steps=...) takes an int >= 1 or None, got {steps!r}")
        weights = given.get("class_weight")
        if weights is not None and not isinstance(weights, Mapping):
            raise TypeError(f"configure_fit(class_weight=...) takes a dict {{class index: weight}}, got {weights!r}")
        for key, value in given.items():
            setattr(self.fit_settings, key, value)
