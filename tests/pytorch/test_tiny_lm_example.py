"""examples/tiny_lm (a GPT-2-style byte-level model on the standard library's sources, streamed through Hugging
Face ``datasets`` and ``det.pytorch.DataLoader``) on 2 gloo ranks with FSDP2, shrunk to 24 batches: it learns,
and a run stopped mid-stream (a stop request after batch 16) and resumed from "latest" ends bitwise where the
uninterrupted run ends (weights, AdamW state, learning rate, the last reports). One 2-rank launch runs the
three scenarios in a row."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support import helpers_two_ranks as two_ranks
from support.helpers_paths import REPO, SUPPORT

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device")]

WORKER = SUPPORT / "worker_tiny_lm.py"
RUN_S = 300  # both ranks' whole plan, to their exit
LENGTH = 24
STOP_AFTER = 15  # batch_idx: 16 batches trained, between the checkpoints at 12 and 24


def _config() -> dict[str, Any]:
    hparams = {"global_batch_size": 8, "block_size": 64, "width": 64, "layers": 2, "heads": 2, "lr": 0.003,
               "weight_decay": 0.1, "warmup_batches": 4, "schedule_batches": LENGTH, "clip": 1.0,
               "validation_blocks": 32}
    return {"searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": LENGTH}},
            "hyperparameters": hparams, "reproducibility": {"experiment_seed": 5}}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[two_ranks.Results, Path]:
    tmp = tmp_path_factory.mktemp("tiny_lm")
    common = {"config": _config(), "length": LENGTH, "report": 4, "validate": 12}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(tmp / "hf_home"))  # datasets' cache files (locks) stay in the test's folder
        return two_ranks.launch(WORKER, tmp, [
            {"name": "whole", "run_dir": str(tmp / "whole"), **common},
            {"name": "stop", "run_dir": str(tmp / "stopped"), "stop_after": STOP_AFTER, **common},
            {"name": "resume", "run_dir": str(tmp / "stopped"), "latest_checkpoint": "latest", **common},
        ], RUN_S), tmp


def test_the_example_learns_under_fsdp2(results: tuple[two_ranks.Results, Path]) -> None:
    runs, _ = results
    whole = runs["whole"][0]
    assert all(rank["fsdp"] for rank in runs["whole"]) and whole["exit_reason"] == "completed"
    losses = [report["loss"] for report in whole["training"]]
    assert len(losses) == LENGTH // 4 and losses[-1] < losses[0] - 1.0, losses  # ln(257) = 5.55 at the start
    (_, last) = whole["validation"]
    assert last["validation_loss"] < math.log(257) - 1.0
    assert last["validation_perplexity"] == pytest.approx(math.exp(last["validation_loss"]), rel=1e-5)


def test_a_stopped_and_resumed_run_ends_bitwise_equal(results: tuple[two_ranks.Results, Path]) -> None:
    runs, tmp = results
    assert [rank["exit_reason"] for rank in runs["stop"]] == ["stopped", "stopped"]
    assert [rank["exit_reason"] for rank in runs["resume"]] == ["completed", "completed"]
    whole, resumed = runs["whole"][0], runs["resume"][0]
    assert resumed["validation"][-1] == whole["validation"][-1]
    assert resumed["training"][-2:] == whole["training"][-2:]  # batches 17-20 and 21-24
    for rank in range(2):
        want = torch.load(tmp / f"whole-rank{rank}.pt", weights_only=True)
        got = torch.load(tmp / f"resume-rank{rank}.pt", weights_only=True)
        assert want.keys() == got.keys() and any(k.startswith("optim.") for k in want)
        assert [k for k in want if not torch.equal(want[k], got[k])] == []


def test_the_example_says_nothing_of_tensorflow() -> None:
    """Hugging Face datasets logs at import, at INFO, that TensorFlow is available: the example's log (INFO under
    the harness) leaves that line out."""
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO); sys.path.insert(0, 'examples/tiny_lm'); "
            "import model_def, datasets; print('imported')")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr
    assert "TensorFlow" not in done.stderr and "Tensorflow" not in done.stderr, done.stderr
