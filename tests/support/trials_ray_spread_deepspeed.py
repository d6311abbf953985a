"""The Ray multi-node tests' DeepSpeedTrial: ``trials_deepspeed.DSTrial`` whose ranks each say once which
Ray node they run on; copied into the context folder as ``spread_ds_trial.py`` (with trials_deepspeed.py
and trials_pytorch.py)."""

from __future__ import annotations

import os
from typing import Any

from trials_deepspeed import DSTrial


class SpreadDSTrial(DSTrial):
    def __init__(self, context: Any) -> None:
        super().__init__(context)
        print(f"rank {context.distributed.get_rank()} of {context.distributed.get_size()} on node "
              f"{os.environ.get('DET_RAY_NODE_ID')} pid {os.getpid()}", flush=True)
