"""Where a PyTorch trial's tensors live and in which precision they compute: the default device and
``to_device`` for nested batches (``_device``), automatic mixed precision's autocast and GradScaler
(``_amp``).

Only torch and numpy.

May import: nothing
"""
