"""``det.keras.init()`` and ``Trainer(trial, context).fit(...)``: run a TFKerasTrial under the loop, in one
process or as one worker of a ``tf.distribute.MultiWorkerMirroredStrategy`` job (``TF_CONFIG``)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import tensorflow as tf

from determined_trials import core
from determined_trials.keras._adapter import KerasAdapter
from determined_trials.keras._backend import require_tensorflow_backend
from determined_trials.keras._context import TFKerasTrialContext
from determined_trials.keras._trial import check_trial_class
from determined_trials.loop import HookRunner, TrainerFront, TrialAdapter, experiment_config, open_trial_context

if TYPE_CHECKING:
    from determined_trials.config import SearcherConfig

__all__ = ["Trainer", "init"]

keras = require_tensorflow_backend()


def _workers_from_tf_config() -> list[str]:
    raw = os.environ.get("TF_CONFIG", "").strip()
    if not raw:
        return []
    try:
        workers = json.loads(raw)["cluster"]["worker"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"TF_CONFIG is not a tf.distribute cluster spec with workers: {raw[:200]!r}") from None
    return list(workers)


def _distributed_from_environment() -> tuple[Any, core.DistributedContext | None]:
    """Under ``launch.tensorflow`` (TF_CONFIG with several workers): the strategy and the job's context."""
    if len(_workers_from_tf_config()) <= 1:
        return None, None
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return strategy, core.DistributedContext.from_torch_distributed()  # RANK, WORLD_SIZE, ... as torchrun sets


def _seed(trial_seed: int) -> None:
    keras.utils.set_random_seed(trial_seed % 2**32)


@contextlib.contextmanager
def init(
    *,
    hparams: Mapping[str, Any] | None = None,
    exp_conf: Any = None,
    distributed: core.DistributedContext | None = None,
    run_dir: str | os.PathLike[str] | None = None,
) -> Iterator[TFKerasTrialContext]:
    """A ``TFKerasTrialContext`` for a ``Trainer``: ``with det.keras.init() as context:``.

    Config and hparams as for ``det.pytorch.init``. Python, NumPy, TensorFlow and Keras RNGs are seeded
    from the trial seed. Under ``python -m determined_trials.launch.tensorflow`` with several slots the
    workers train with ``tf.distribute.MultiWorkerMirroredStrategy``.
    """
    config, metric_named = experiment_config(exp_conf, hparams)
    strategy, dist = (None, distributed) if distributed is not None else _distributed_from_environment()

    def make_context(core_context: core.Context) -> TFKerasTrialContext:
        context = TFKerasTrialContext(core_context=core_context, config=config, hparams=hparams, strategy=strategy)
        if not metric_named:  # init() filled the searcher in
            context._searcher_metric_named = False
        return context

    with open_trial_context(make_context, config, distributed, lambda: dist, run_dir, _seed) as context:
        yield context


class Trainer(TrainerFront):
    """Trains a TFKerasTrial: ``Trainer(trial, context).fit(max_length=Epoch(5), ...)``; same arguments and
    guarantees as ``det.pytorch.Trainer.fit``."""

    _family = "keras"
    _context_class: ClassVar[type] = TFKerasTrialContext
    _check_trial_class = staticmethod(check_trial_class)

    def _make_hooks_and_adapter(self) -> tuple[HookRunner, TrialAdapter]:
        hooks = HookRunner({})
        adapter = KerasAdapter(self._trial, self._context, hooks)
        hooks.callbacks["keras_callbacks"] = adapter.callbacks
        return hooks, adapter

    def _searcher_metric(self, searcher: SearcherConfig) -> str | None:
        """Validation metrics carry Keras's ``val_`` prefix; ``loss``, ``val_loss`` and ``validation_loss`` all
        name ``val_loss``."""
        metric = super()._searcher_metric(searcher)
        if metric is None or metric.startswith("val_"):
            return metric
        return f"val_{metric.removeprefix('validation_')}"
