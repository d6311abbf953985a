"""Runs a plan of DeepSpeedTrial scenarios on 2 ranks: tests/support/worker_deepspeed.py through the
torch_distributed launcher (gloo, no shm op build), for ``test_deepspeed_distributed.py`` and
``test_deepspeed_zero3.py``. A job that outlives its timeout is killed with its ranks (a hung collective)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.helpers_paths import SUPPORT

__all__ = ["run_plan"]


def run_plan(tmp: Path, scenarios: list[dict[str, Any]], *, timeout: float) -> tuple[int, str, dict[str, Any]]:
    """The launcher's exit code, its output and ``{name: [rank 0's result, rank 1's]}`` of the scenarios
    that wrote one. Each scenario runs in ``<tmp>/run/<its name up to the first _>``."""
    scenarios = [{**s, "run_dir": str(tmp / "run" / s["name"].split("_")[0])} for s in scenarios]
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"out": str(tmp), "scenarios": scenarios}))
    config = tmp / "launch.yaml"
    config.write_text("resources: {slots_per_trial: 2}\nsearcher: {name: single, metric: val_loss, "
                      "max_length: {batches: 1}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env.update(PYTHONPATH=os.pathsep.join([str(SUPPORT), env.get("PYTHONPATH", "")]), DET_DEEPSPEED_SHM_COMM="0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "determined_trials.launch.torch_distributed", "--config", str(config), "--",
         str(SUPPORT / "worker_deepspeed.py"), str(plan)],
        env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank: nothing left behind
        output, _ = proc.communicate()
        output += f"\n(killed after {timeout} s: the job hung)"
    results = {s["name"]: [json.loads(f.read_text()) for f in (tmp / f"{s['name']}-rank{r}.json" for r in (0, 1))
                           if f.exists()] for s in scenarios}
    return proc.returncode, output, results
