"""``det.pytorch.samplers``: the public home of the data chain's samplers (they live in ``pytorch/data/``)."""

from determined_trials.pytorch.data import _samplers
from determined_trials.pytorch.data._samplers import *  # noqa: F403  (the public names, listed once there)

__all__ = list(_samplers.__all__)
