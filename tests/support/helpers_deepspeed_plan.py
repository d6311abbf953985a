"""Runs a plan of DeepSpeedTrial scenarios on 2 ranks: tests/support/worker_deepspeed.py through the
torch_distributed launcher (gloo, no shm op build), for ``test_deepspeed_distributed.py``,
``test_deepspeed_zero3.py`` and ``test_deepspeed_offload.py``. A job that outlives its timeout is killed with its ranks (a hung collective)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.helpers_paths import SUPPORT

__all__ = ["cpu_adam_prebuilt", "run_plan"]


def run_plan(tmp: Path, scenarios: list[dict[str, Any]], *, timeout: float,
             ranks: int = 2) -> tuple[int, str, dict[str, Any]]:
    """The launcher's exit code, its output and ``{name: [rank 0's result, rank 1's, ...]}`` of the scenarios
    that wrote one, run on ``ranks`` processes. Each scenario runs in ``<tmp>/run/<its name up to the first _>``
    (plans may share ``tmp``: a later plan resumes an earlier one's checkpoint by its ``resume_uuid``)."""
    scenarios = [{**s, "run_dir": str(tmp / "run" / s["name"].split("_")[0])} for s in scenarios]
    plan = tmp / f"plan{ranks}.json"
    plan.write_text(json.dumps({"out": str(tmp), "scenarios": scenarios}))
    config = tmp / "launch.yaml"
    config.write_text(f"resources: {{slots_per_trial: {ranks}}}\n"
                      "searcher: {name: single, metric: val_loss, max_length: {batches: 1}}\n")
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
    files = {s["name"]: [tmp / f"{s['name']}-rank{r}.json" for r in range(ranks)] for s in scenarios}
    results = {name: [json.loads(f.read_text()) for f in paths if f.exists()] for name, paths in files.items()}
    return proc.returncode, output, results


def cpu_adam_prebuilt() -> str | None:
    """None when DeepSpeed's CPU Adam op is installed or compiled in the torch extensions cache (a run then
    loads it in about a second); otherwise why not, naming the set-up command that builds it."""
    from deepspeed.git_version_info import installed_ops
    from torch.utils.cpp_extension import _get_build_directory

    if installed_ops.get("cpu_adam"):
        return None
    built = Path(_get_build_directory("cpu_adam", verbose=False)) / "cpu_adam.so"
    if built.is_file():
        return None
    return (f"DeepSpeed's cpu_adam op is not prebuilt ({built} is missing): run `make venv`, which builds it once "
            "(~70 s), instead of letting the first offload run compile it inside a test's timeout")
