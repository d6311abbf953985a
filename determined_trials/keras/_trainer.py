"""``det.keras.init()`` and ``Trainer(trial, context).fit(...)``: run a TFKerasTrial under the loop, in one
process or as one worker of a ``tf.distribute.MultiWorkerMirroredStrategy`` job (``TF_CONFIG``)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import tensorflow as tf

from determined_trials import core
from determined_trials._trial_context import _DEFAULT_SEARCHER
from determined_trials.config import ExperimentConfig, load_config
from determined_trials.keras._adapter import KerasAdapter
from determined_trials.keras._backend import require_tensorflow_backend
from determined_trials.keras._context import TFKerasTrialContext
from determined_trials.keras._trial import TFKerasTrial, check_trial_class
from determined_trials.loop import Batch, Controller, ExitReason, HookRunner, LoopSettings, TrainUnit
from determined_trials.loop._resume import interrupt_stops_training, resolve_resume

__all__ = ["Trainer", "init"]

keras = require_tensorflow_backend()
_DEFAULT_REPORTING_PERIOD = Batch(100)


def _experiment_config(exp_conf: Any, hparams: Mapping[str, Any] | None) -> ExperimentConfig | None:
    if exp_conf is not None:
        return load_config(exp_conf)
    if hparams is not None:
        return load_config({"hyperparameters": dict(hparams), "searcher": dict(_DEFAULT_SEARCHER)})
    return None


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
    config = _experiment_config(exp_conf, hparams)
    strategy, dist = (None, distributed) if distributed is not None else _distributed_from_environment()
    with contextlib.ExitStack() as owned:
        if distributed is None and dist is not None:
            owned.callback(dist.close)
        core_context = owned.enter_context(core.init(distributed=dist, config=config, run_dir=run_dir))
        keras.utils.set_random_seed(core_context.info.trial.trial_seed % 2**32)
        yield TFKerasTrialContext(core_context=core_context, config=config, hparams=hparams, strategy=strategy)


class Trainer:
    """Trains a TFKerasTrial: ``Trainer(trial, context).fit(max_length=Epoch(5), ...)``; same arguments and
    guarantees as ``det.pytorch.Trainer.fit``."""

    def __init__(self, trial: TFKerasTrial, context: TFKerasTrialContext) -> None:
        check_trial_class(type(trial))
        if not isinstance(context, TFKerasTrialContext) or context._core is None:
            raise TypeError("Trainer needs the context from `with det.keras.init() as context:`")
        self._trial = trial
        self._context = context
        self.exit_reason: ExitReason | None = None

    def fit(
        self,
        checkpoint_period: TrainUnit | None = None,
        validation_period: TrainUnit | None = None,
        max_length: TrainUnit | None = None,
        reporting_period: TrainUnit | None = _DEFAULT_REPORTING_PERIOD,
        checkpoint_policy: str = "best",
        latest_checkpoint: str | None = None,
        step_zero_validation: bool = False,
        test_mode: bool = False,
        profiling_enabled: bool = False,
        *,
        show_progress: bool | None = None,
    ) -> None:
        """Train until ``max_length`` (or each searcher operation), validating and checkpointing at the
        periods, resuming from ``latest_checkpoint``; a preemption or stop request ends training after
        the current batch with a checkpoint (``self.exit_reason`` says which)."""
        core_context = self._context._core
        assert core_context is not None
        searcher = self._context.config.searcher
        settings = LoopSettings(
            max_length=max_length, validation_period=validation_period, checkpoint_period=checkpoint_period,
            reporting_period=reporting_period, checkpoint_policy=checkpoint_policy,
            step_zero_validation=step_zero_validation, test_mode=test_mode, profiling_enabled=profiling_enabled,
            show_progress=show_progress, searcher_metric=_searcher_metric(searcher.metric),
            smaller_is_better=searcher.smaller_is_better,
        )
        latest_checkpoint = resolve_resume(core_context, latest_checkpoint)
        hooks = HookRunner({})
        adapter = KerasAdapter(self._trial, self._context, hooks)
        hooks.callbacks["keras_callbacks"] = adapter.callbacks
        controller = Controller(core=core_context, adapter=adapter, hooks=hooks, settings=settings)
        with interrupt_stops_training(core_context) as exits:  # Ctrl-C as for PyTorch: stop, checkpoint, exit 75
            self.exit_reason = controller.run(latest_checkpoint)
            exits.append(self.exit_reason)


def _searcher_metric(metric: str | None) -> str | None:
    """Validation metrics carry Keras's ``val_`` prefix; ``loss``, ``val_loss`` and ``validation_loss`` all
    name ``val_loss``."""
    if metric is None or metric.startswith("val_"):
        return metric
    return f"val_{metric.removeprefix('validation_')}"
