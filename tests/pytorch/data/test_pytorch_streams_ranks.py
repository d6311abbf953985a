"""Streams on 2 ranks through the launcher (torchrun, gloo on loopback) with 2 data-loader workers each: an
uninterrupted launch, and a launch stopped mid-epoch (SIGTERM through the launcher; the test takes a stop request
too) then resumed from "latest", see the same records on every rank and end with bitwise-equal weights; the ranks'
parts of the stream are disjoint and differ in length (passes end at different steps), and validation over them
ends on both ranks. The stop comes after the ranks' batches differed in size, so their dropout RNGs had drifted
apart: each rank must resume with its own RNG state, not rank 0's."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support.helpers_paths import SUPPORT
from trials_pytorch import assert_same_state
from trials_stream import write_shards

import determined_trials as det

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device")]

BATCHES = 14
SIZES = (9, 10, 11, 16)  # rank 0 reads shards 0 and 2, rank 1 shards 1 and 3 (split_dataset_by_node)
FLAG_BATCH = 6  # the SIGTERM comes after batch 4, where the ranks' batches hold 1 and 2 records
SEEN = re.compile(r"^rank (\d) seen (\d+) (\d+) (\[.*\])$")


def _config(folder: Path, name: str, **hparams: object) -> Path:
    hp = {"global_batch_size": 8, "lr": 0.01, "print": True, **hparams}
    path = folder / name
    path.write_text(
        f"hyperparameters: {hp!r}\n".replace("'", '"').replace("True", "true")
        + f"searcher: {{name: single, metric: validation_loss, max_length: {{batches: {BATCHES}}}}}\n"
        "min_validation_period: {batches: 5}\nresources: {slots_per_trial: 2}\n"
        "reproducibility: {experiment_seed: 7}\n"
    )
    return path


def _launch(config: Path, run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env.update(DET_RUN_DIR=str(run_dir), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, "-m", "determined_trials.launch.torch_distributed", "--config", str(config), *extra,
         "--trial", "trials_stream.py:StreamTrial"],
        cwd=SUPPORT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _finish(proc: subprocess.Popen[str], expect: int) -> str:
    try:
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == expect, output[-4000:]
    return output


def _seen(output: str) -> dict[int, list[tuple[int, int, str]]]:
    found: dict[int, list[tuple[int, int, str]]] = {0: [], 1: []}
    for line in output.splitlines():
        match = SEEN.match(line.split("] ", 1)[-1].strip())
        if match:
            found[int(match.group(1))].append((int(match.group(2)), int(match.group(3)), match.group(4)))
    return found


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    last = det.core.LocalStore(run_dir).checkpoints()[-1]
    assert last.steps_completed == BATCHES
    state = torch.load(run_dir / "checkpoints" / last.uuid / "state_dict.pth", weights_only=True)
    return {"model": state["models_state_dict"][0], "optimizer": state["optimizers_state_dict"][0]}


@pytest.mark.parametrize(("kind", "workers", "stop"), [("hf", 2, "sigterm")])
def test_two_ranks_stop_and_resume_bitwise(tmp_path: Path, kind: str, workers: int, stop: str) -> None:
    data = tmp_path / "data"
    write_shards(data, SIZES)
    base = {"kind": kind, "data_dir": str(data), "workers": workers}
    whole = _finish(_launch(_config(tmp_path, "whole.yaml", **base), tmp_path / "whole"), 0)
    reference = _seen(whole)
    for rank in (0, 1):
        assert [b for _, b, _ in reference[rank]] == list(range(BATCHES)), whole[-3000:]
    first_pass = [[r for e, _, batch in reference[rank] if e == 0 for r in eval(batch)] for rank in (0, 1)]
    assert not set(first_pass[0]) & set(first_pass[1])  # disjoint parts covering the records
    assert sorted(first_pass[0] + first_pass[1]) == list(range(sum(SIZES)))
    if kind == "hf" and workers == 2:  # a shard per worker: passes of 3 + 3 and 3 + 4 batches (the last partial)
        assert [e for e, _, _ in reference[0]][6] == 1 and [e for e, _, _ in reference[1]][6] == 0
        assert len(eval(reference[0][4][2])) != len(eval(reference[1][4][2]))  # the dropout RNGs drift apart

    run_dir = tmp_path / "run"
    if stop == "sigterm":
        flag = tmp_path / "flag"
        slow = _config(tmp_path, "slow.yaml", **base, flag_path=str(flag), flag_batch=FLAG_BATCH, batch_sleep=1.0)
        proc = _launch(slow, run_dir)
        deadline = time.monotonic() + 240
        while not flag.exists():
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, f"the launch never reached batch {FLAG_BATCH}"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        first = _finish(proc, 75)
    else:
        first = _finish(_launch(_config(tmp_path, "stop.yaml", **base, stop_after=7), run_dir), 0)
    stopped = det.core.LocalStore(run_dir).checkpoints()[-1].steps_completed
    assert 4 < stopped < BATCHES
    second = _finish(_launch(_config(tmp_path, "whole.yaml", **base), run_dir, "--latest-checkpoint", "latest"), 0)
    before, after = _seen(first), _seen(second)
    for rank in (0, 1):
        assert before[rank][:stopped] + after[rank] == reference[rank], (rank, first[-2000:], second[-2000:])
    assert_same_state(_weights(run_dir), _weights(tmp_path / "whole"))
