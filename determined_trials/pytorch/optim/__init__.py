"""The optimizer's side of a PyTorch trial: one optimizer step after gradient aggregation (``_stepping``:
average, unscale, clip, step, zero) and the LR scheduler wrapper with its step mode and state
(``_lr_scheduler``, public as ``det.pytorch.LRScheduler``).

Only torch.

May import: nothing
"""

from determined_trials.pytorch.optim._lr_scheduler import LRScheduler
from determined_trials.pytorch.optim._stepping import check_params_wrapped, step_optimizer

__all__ = [
    "LRScheduler",
    "check_params_wrapped",
    "step_optimizer",
]
