"""``det.deepspeed.init()`` and ``Trainer(trial, context).fit(...)``: run a DeepSpeedTrial under the loop,
with the same arguments and guarantees as the PyTorch Trainer."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from determined_trials import core, pytorch
from determined_trials.deepspeed._adapter import DeepSpeedAdapter
from determined_trials.deepspeed._context import DeepSpeedTrialContext
from determined_trials.deepspeed._distributed import start_deepspeed_distributed
from determined_trials.deepspeed._trial import check_trial_class
from determined_trials.loop import HookRunner, TrialAdapter, experiment_config, open_trial_context

__all__ = ["Trainer", "init"]


@contextlib.contextmanager
def init(
    *,
    hparams: Mapping[str, Any] | None = None,
    exp_conf: Any = None,
    distributed: core.DistributedContext | None = None,
    enable_tensorboard_logging: bool = True,
    run_dir: str | os.PathLike[str] | None = None,
) -> Iterator[DeepSpeedTrialContext]:
    """A ``DeepSpeedTrialContext`` for a ``Trainer``: ``with det.deepspeed.init() as context:``.

    Starts DeepSpeed's communication (gloo on CPU, nccl on CUDA; a group of one for a lone process),
    then works as ``det.pytorch.init()``: config and hparams from the launcher or the arguments, RNGs
    seeded from the trial seed. ``run_dir`` is a local addition.
    """
    config, metric_named = experiment_config(exp_conf, hparams)
    environment = start_deepspeed_distributed()

    def make_context(core_context: core.Context) -> DeepSpeedTrialContext:
        context = DeepSpeedTrialContext(core_context=core_context, config=config, hparams=hparams,
                                        enable_tensorboard_logging=enable_tensorboard_logging)
        if not metric_named:  # init() filled the searcher in
            context._searcher_metric_named = False
        return context

    with open_trial_context(make_context, config, distributed, lambda: environment, run_dir,
                            pytorch.seed_everything) as context:
        yield context


class Trainer(pytorch.Trainer):
    """Trains a DeepSpeedTrial: ``Trainer(trial, context).fit(max_length=Epoch(5), ...)`` (the arguments
    of ``det.pytorch.Trainer.fit``)."""

    _family = "deepspeed"
    _context_class: ClassVar[type] = DeepSpeedTrialContext
    _check_trial_class = staticmethod(check_trial_class)

    def _make_adapter(self, hooks: HookRunner) -> TrialAdapter:
        return DeepSpeedAdapter(self._trial, self._context, hooks)
