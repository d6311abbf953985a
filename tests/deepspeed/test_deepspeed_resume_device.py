"""DeepSpeedTrial, ZeRO-2 in bfloat16, on each device in a process of its own: resumed after a stop it
equals the uninterrupted run bitwise, and ``checkpoint export --consolidate`` equals the engine's weights.
The ``cuda`` case (GPU tier) runs on nccl; the ``cpu`` case on gloo with DeepSpeed's CPU accelerator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.helpers_paths import SUPPORT

WORKER = SUPPORT / "worker_deepspeed_resume.py"
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TIMEOUT_S = 900  # DeepSpeed's import and three fits; generous for a loaded machine


@pytest.mark.parametrize("device", [
    pytest.param("cpu", id="cpu", marks=pytest.mark.slow),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, NEEDS_CUDA]),
])
def test_zero2_bf16_resume_is_bitwise_and_the_export_equals_the_engine(tmp_path: Path, device: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
           "DET_DEEPSPEED_SHM_COMM": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    if device == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(WORKER), device, str(tmp_path / "runs"), str(out)],
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["device"].startswith(device), result
    assert result["dtype"] == "torch.bfloat16"
    assert (result["stop_reason"], result["end_reason"]) == ("stopped", "completed")
    assert result["resumed_equals_straight"], "the resumed run's weights differ from the uninterrupted run's"
    assert result["export_keys"] == result["parameters"] and result["export_equals_engine"]
