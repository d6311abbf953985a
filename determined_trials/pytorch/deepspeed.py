"""``det.pytorch.deepspeed``: the original's import path for ``det.deepspeed`` (the very same module),
so ``from determined.pytorch import deepspeed as det_ds`` ports by changing the package name."""

import sys

from determined_trials import deepspeed as _deepspeed

sys.modules[__name__] = _deepspeed
