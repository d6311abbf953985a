"""The optimizer's side of a PyTorch trial: one optimizer step after gradient aggregation (``_stepping``:
average, unscale, clip, step, zero) and the LR scheduler wrapper with its step mode and state
(``_lr_scheduler``, public as ``det.pytorch.LRScheduler``).

Only torch.

May import: nothing
"""
