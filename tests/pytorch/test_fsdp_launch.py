"""The FSDP2 example trial (examples/fsdp_mlp) through the real front doors: ``det-trials experiment create``
with ``slots_per_trial: 2`` and ``launch.torch_distributed --trial`` (torchrun, 2 gloo processes). A launch
preempted by SIGTERM and resumed from "latest" ends with a checkpoint bitwise equal to the experiment's
uninterrupted launch's (every DCP tensor: weights, AdamW state); its export (``checkpoint export --consolidate``)
and ``load_trial_from_checkpoint_path`` in this process (no torch.distributed) give the trained weights."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support.helpers_fsdp_example import BATCHES, EXAMPLE, dcp_tensors, fsdp_config, last_checkpoint

import determined_trials as det
from determined_trials.cli.main import main as cli_main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device")]

def _env(run_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env["DET_RUN_DIR"] = str(run_dir)
    return env


def test_sigterm_resume_equals_the_experiment_and_exports(tmp_path: Path) -> None:
    code = tmp_path / "code"
    shutil.copytree(EXAMPLE, code)
    exp_dir = tmp_path / "exp"
    created = subprocess.run(
        [sys.executable, "-m", "determined_trials.cli.main", "--run-dir", str(exp_dir), "experiment", "create",
         "--no-progress", str(fsdp_config(tmp_path, "exp.yaml")), str(code)],
        env=_env(exp_dir), capture_output=True, text=True, timeout=300,
    )
    assert created.returncode == 0, created.stdout[-4000:] + created.stderr[-4000:]
    uuid, exp_checkpoint = last_checkpoint(exp_dir)
    assert sorted(p.name for p in (exp_checkpoint / "dcp").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]

    args = [sys.executable, "-m", "determined_trials.launch.torch_distributed", "--trial", "model_def.py:FSDPMLPTrial"]
    quick = fsdp_config(tmp_path, "quick.yaml")
    whole_dir = tmp_path / "whole"  # the uninterrupted launch (an experiment's trial has another trial seed)
    whole = subprocess.run([*args[:3], "--config", str(quick), *args[3:]], cwd=code, env=_env(whole_dir),
                           capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stdout[-4000:] + whole.stderr[-4000:]
    _, reference = last_checkpoint(whole_dir)

    run_dir = tmp_path / "launch"
    slow = fsdp_config(tmp_path, "slow.yaml", sleep=0.2)
    first = subprocess.Popen([*args[:3], "--config", str(slow), *args[3:]], cwd=code, env=_env(run_dir),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert first.stdout is not None
        for line in first.stdout:
            if "rank 0 trained batch 5" in line:  # after the checkpoint at 4: its background write is in flight
                time.sleep(0.1)
                first.send_signal(signal.SIGTERM)
                break
        rest, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 75, rest[-4000:]
    stopped = det.core.LocalStore(run_dir).checkpoints()[-1].steps_completed
    assert 6 <= stopped < BATCHES
    second = subprocess.run([*args[:3], "--config", str(quick), "--latest-checkpoint",
                             "latest", *args[3:]], cwd=code, env=_env(run_dir), capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    assert f"rank 0 trained batch {stopped}\n" in second.stdout and "rank 0 trained batch 0\n" not in second.stdout
    _, resumed = last_checkpoint(run_dir)
    want, got = dcp_tensors(reference), dcp_tensors(resumed)
    assert want.keys() == got.keys() and any(k.startswith("optim.state.") for k in want)
    assert all(torch.equal(want[k], got[k]) for k in want), [k for k in want if not torch.equal(want[k], got[k])]

    want = dcp_tensors(exp_checkpoint)  # the experiment's trained model, exported and loaded
    export = tmp_path / "export"
    assert cli_main(["--run-dir", str(exp_dir), "checkpoint", "export", "--consolidate", uuid, str(export)]) == 0
    exported = torch.load(export / "model0_consolidated.pt", weights_only=True)
    sys.path.insert(0, str(code))
    try:
        from model_def import MLP

        plain = MLP(16, 2)
        plain.load_state_dict(exported)  # strict: every key of the unsharded model, nothing else
        trial = det.pytorch.load_trial_from_checkpoint_path(exp_checkpoint)
    finally:
        sys.path.remove(str(code))
    trained = {k[len("model.0."):]: v for k, v in want.items() if k.startswith("model.0.")}
    assert exported.keys() == trained.keys() and all(torch.equal(exported[k], trained[k]) for k in trained)
    loaded = trial.model.state_dict()  # type: ignore[attr-defined]
    assert all(torch.equal(loaded[k], trained[k]) for k in trained)
