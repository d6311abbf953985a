"""The Ray multi-node tests' DeepSpeedTrial: ``deepspeed_trials.DSTrial`` whose ranks each say once which
Ray node they run on; copied into the context folder as ``spread_ds_trial.py`` (with deepspeed_trials.py
and pytorch_trials.py)."""

from __future__ import annotations

import os
from typing import Any

from deepspeed_trials import DSTrial


class SpreadDSTrial(DSTrial):
    def __init__(self, context: Any) -> None:
        super().__init__(context)
        print(f"rank {context.distributed.get_rank()} of {context.distributed.get_size()} on node "
              f"{os.environ.get('DET_RAY_NODE_ID')} pid {os.getpid()}", flush=True)
