"""The ``--trial`` harness's hooks for a DeepSpeedTrial: check the class, then train it with ``Trainer.fit``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from determined_trials.deepspeed._trainer import Trainer, init
from determined_trials.deepspeed._trial import check_trial_class
from determined_trials.loop import ExitReason

__all__ = ["check_trial", "train"]


def check_trial(cls: type) -> None:
    """``TypeError`` saying why ``cls`` cannot run as a DeepSpeedTrial."""
    check_trial_class(cls)


def train(
    trial_cls: type, config: Any, fit_arguments: dict[str, Any], on_ready: Callable[[], None],
) -> ExitReason | None:
    """Train ``trial_cls`` under ``config`` (this process is one rank); ``on_ready`` once signals are handled."""
    trainer = None
    with init(exp_conf=config) as context:  # swallows InvalidHP: the trial ends early, as a success
        on_ready()
        trainer = Trainer(trial_cls(context), context)
        trainer.fit(**fit_arguments)
    return None if trainer is None else trainer.exit_reason
