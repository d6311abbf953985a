"""Keras's own ``train_step``/``test_step`` compiled once with ``tf.function`` and run under the trial's
``tf.distribute`` strategy (``strategy.run``), instead of ``model.fit``, which Keras 3 breaks under
MultiWorkerMirroredStrategy (keras-team/keras#20585)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from determined_trials.keras._backend import require_tensorflow_backend

__all__ = ["CompiledSteps"]

keras = require_tensorflow_backend()


class CompiledSteps:
    """The model's train and test steps; each returns this worker's logs as tensors (no host sync)."""

    def __init__(self, model: Any, strategy: Any) -> None:
        self._model = model
        self._strategy = strategy if strategy is not None else tf.distribute.get_strategy()
        self.train: Callable[[Any], dict[str, Any]] = self._compile(model.train_step)
        self.test: Callable[[Any], dict[str, Any]] = self._compile(model.test_step)

    def build(self, sample: Any) -> None:
        """Create every variable (model, compiled metrics and loss, optimizer) from a sample batch,
        inside the strategy's scope, so the optimizer's state exists before a checkpoint loads."""
        model = self._model
        with self._strategy.scope():
            model._symbolic_build(data_batch=sample)  # what fit() does first; public API has no equivalent
            if model.optimizer is not None and not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)

    def _compile(self, step: Callable[[Any], Any]) -> Callable[[Any], dict[str, Any]]:
        strategy = self._strategy

        def one_step(data: Any) -> Any:
            outputs = strategy.run(step, args=(data,))
            return keras.tree.map_structure(lambda v: strategy.experimental_local_results(v)[0], outputs)

        if self._model.run_eagerly:
            return one_step
        return tf.function(one_step, reduce_retracing=True, jit_compile=bool(self._model.jit_compile))
