"""A rank of a bare Core API script that polls should_preempt() until told to stop (used by tests)."""

import json
import sys
import time

import determined_trials as det

rank, size, run_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist = det.core.DistributedContext(
    rank=rank, size=size, local_rank=rank, local_size=size, cross_rank=0, cross_size=1, timeout=60
)
config = {"searcher": {"name": "single", "metric": "loss", "max_length": 1}}
with det.core.init(distributed=dist, run_dir=run_dir, config=config) as ctx:
    print("ready", flush=True)
    calls = 0
    while not ctx.preempt.should_preempt():
        calls += 1
        time.sleep(0.005)
    print(json.dumps({"rank": rank, "calls": calls, "trial": ctx.info.trial.trial_id}), flush=True)
dist.close()
