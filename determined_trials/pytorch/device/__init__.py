"""Where a PyTorch trial's tensors live and in which precision they compute: the default device and
``to_device`` for nested batches (``_device``), automatic mixed precision's autocast and GradScaler
(``_amp``).

Only torch and numpy.

May import: nothing
"""

from determined_trials.pytorch.device._amp import (
    default_autocast_dtype,
    install_autocast_forward,
    make_autocast,
    needs_scaler,
)
from determined_trials.pytorch.device._device import default_device, to_device

__all__ = [
    "default_autocast_dtype",
    "default_device",
    "install_autocast_forward",
    "make_autocast",
    "needs_scaler",
    "to_device",
]
