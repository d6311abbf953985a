"""The experiment tests' tiny trial, recording in the trial's metadata where it ran (the Ray node id the
executor hands it, or none) and its process id; copied into the context folder next to the script."""

from __future__ import annotations

import os
from typing import Any

import trials_core_script as base

import determined_trials as det

_init = det.core.init


def _init_recording(**kwargs: Any) -> Any:
    ctx = _init(**kwargs)
    ctx.store.set_trial_metadata(ctx.info.trial.trial_id,
                                 {"node": os.environ.get("DET_RAY_NODE_ID"), "pid": os.getpid()})
    return ctx


det.core.init = _init_recording

if __name__ == "__main__":
    base.main()
