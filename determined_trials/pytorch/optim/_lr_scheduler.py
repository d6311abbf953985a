"""The LR scheduler wrapper: when the harness steps a wrapped scheduler (``StepMode``), and its
checkpoint state (the scheduler's plus the wrapper's optimizer-step counter)."""

from __future__ import annotations

import enum
import warnings
from typing import Any

import torch

__all__ = ["LRScheduler"]

_FORMAT = "determined_trials.LRScheduler/1"
_EARLY_STEP_WARNING = r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`"


class LRScheduler:
    """A wrapped learning-rate scheduler and the rule for stepping it automatically.

    After every training batch the trainer calls ``after_batch``, which steps the scheduler:

    - ``STEP_EVERY_BATCH``: after every ``frequency``-th batch (``(batch_idx + 1) % frequency
      == 0``), whether or not the optimizer stepped on that batch (no catch-up bursts);
    - ``STEP_EVERY_OPTIMIZER_STEP``: after every ``frequency``-th actual optimizer step (counted
      in optimizer steps, not batches, so gradient aggregation does not change the meaning);
    - ``STEP_EVERY_EPOCH``: after the last batch of epoch ``e`` when ``(e + 1) % frequency == 0``;
    - ``MANUAL_STEP``: never; call ``scheduler.step()`` yourself.
    """

    class StepMode(enum.Enum):
        """When the harness steps a wrapped scheduler."""

        STEP_EVERY_EPOCH = 1
        STEP_EVERY_BATCH = 2
        MANUAL_STEP = 3
        STEP_EVERY_OPTIMIZER_STEP = 4

    def __init__(self, scheduler: Any, step_mode: LRScheduler.StepMode, frequency: int = 1) -> None:
        if not isinstance(step_mode, LRScheduler.StepMode):
            raise TypeError(
                f"step_mode must be an LRScheduler.StepMode (e.g. "
                f"LRScheduler.StepMode.STEP_EVERY_EPOCH), got {step_mode!r}"
            )
        if isinstance(frequency, bool) or not isinstance(frequency, int):
            raise TypeError(f"frequency must be an int >= 1, got {frequency!r}")
        if frequency < 1:
            raise ValueError(f"frequency must be >= 1, got {frequency}")
        for method in ("step", "state_dict", "load_state_dict"):
            if not callable(getattr(scheduler, method, None)):
                raise TypeError(
                    f"wrap_lr_scheduler needs a scheduler with a {method}() method, got "
                    f"{type(scheduler).__qualname__}"
                )
        plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        if plateau and step_mode is not LRScheduler.StepMode.MANUAL_STEP:
            raise ValueError(
                "ReduceLROnPlateau needs a metric to step, so it must be wrapped with "
                "step_mode=LRScheduler.StepMode.MANUAL_STEP; call scheduler.step(metric) yourself "
                "(e.g. in a PyTorchCallback's on_validation_end)"
            )
        self._scheduler = scheduler
        self._step_mode = step_mode
        self._frequency = frequency
        self._optimizer_steps = 0

    @property
    def scheduler(self) -> Any:
        """The wrapped torch scheduler."""
        return self._scheduler

    @property
    def step_mode(self) -> LRScheduler.StepMode:
        return self._step_mode

    @property
    def frequency(self) -> int:
        return self._frequency

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps counted so far (checkpointed; drives STEP_EVERY_OPTIMIZER_STEP)."""
        return self._optimizer_steps

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the scheduler now."""
        self._scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return list(self._scheduler.get_last_lr())

    def after_batch(
        self, batch_idx: int, optimizer_stepped: bool, epoch_ended: bool, epoch_idx: int
    ) -> bool:
        """Called by the trainer after training batch ``batch_idx`` (0-based, counted over the
        whole run) of epoch ``epoch_idx``; steps the scheduler when due and says whether it did."""
        mode = self._step_mode
        if optimizer_stepped:
            self._optimizer_steps += 1
        if mode is LRScheduler.StepMode.STEP_EVERY_BATCH:
            due = (batch_idx + 1) % self._frequency == 0
        elif mode is LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP:
            due = optimizer_stepped and self._optimizer_steps % self._frequency == 0
        elif mode is LRScheduler.StepMode.STEP_EVERY_EPOCH:
            due = epoch_ended and (epoch_idx + 1) % self._frequency == 0
        else:
            due = False
        if due:
            self._auto_step()
        return due

    def _auto_step(self) -> None:
        if getattr(self._scheduler, "_step_count", None) != 1:
            self._scheduler.step()
            return
        # torch warns once if the first scheduler step comes before the first optimizer step;
        # stepping every batch under gradient aggregation does that on purpose.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_EARLY_STEP_WARNING, category=UserWarning)
            self._scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state plus the wrapper's optimizer-step counter."""
        return {
            "format": _FORMAT,
            "scheduler": self._scheduler.state_dict(),
            "optimizer_steps": self._optimizer_steps,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from ``state_dict()``; a bare scheduler state dict (as Determined 0.38 saved
        it) is accepted too, with the optimizer-step counter starting from 0."""
        if isinstance(state_dict, dict) and state_dict.get("format") == _FORMAT:
            self._scheduler.load_state_dict(state_dict["scheduler"])
            self._optimizer_steps = int(state_dict["optimizer_steps"])
        else:
            self._scheduler.load_state_dict(state_dict)
            self._optimizer_steps = 0

    def __repr__(self) -> str:
        return (
            f"LRScheduler({type(self._scheduler).__qualname__}, {self._step_mode.name}, "
            f"frequency={self._frequency})"
        )
