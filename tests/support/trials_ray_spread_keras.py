"""The Ray multi-node tests' TFKerasTrial: ``trials_keras.MLPTrial`` whose workers each say once which Ray
node they run on; copied into the context folder as ``spread_keras_trial.py`` (with trials_keras.py)."""

from __future__ import annotations

import os
from typing import Any

from trials_keras import MLPTrial


class SpreadKerasTrial(MLPTrial):
    def build_model(self) -> Any:
        distributed = self.context.distributed
        print(f"rank {distributed.get_rank()} of {distributed.get_size()} on node "
              f"{os.environ.get('DET_RAY_NODE_ID')} pid {os.getpid()}", flush=True)
        return super().build_model()
