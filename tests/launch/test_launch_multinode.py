"""One trial over two "machines": two torch_distributed launchers on 127.0.0.1 joined by torchrun's
multi-node rendezvous (DET_NNODES / DET_NODE_RANK / DET_CHIEF_IP) train exactly like one launcher with
two processes."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support.helpers_launch import BATCH_LINE, DATA, TRIAL, tiny_config, validation_losses

from determined_trials.launch._procs import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400), pytest.mark.usefixtures("cpu_device")]


def _launch(code: Path, run_dir: Path, config: Path, extra: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env.update(DET_RUN_DIR=str(run_dir), **extra)
    with open(out, "wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "determined_trials.launch.torch_distributed", "--config",
                                 str(config), "--trial", "tiny_trial.py:TinyTrial"], cwd=code, env=env,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def _finish(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    try:
        return [p.wait(timeout=240) for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)


def _batches(out: Path) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for line in out.read_text().splitlines():
        match = BATCH_LINE.match(line)
        if match:
            found.setdefault(int(match.group(1)), []).append(int(match.group(3)))
    return found


def test_two_nodes_on_loopback_equal_one_node_with_two_processes(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "tiny_trial.py").write_text(TRIAL)
    (code / "tiny_data.py").write_text(DATA)
    config = tiny_config(tmp_path, "two.yaml", slots=2, batches=8)
    shared = {"DET_NNODES": "2", "DET_CHIEF_IP": "127.0.0.1", "DET_MASTER_PORT": str(free_port()),
              "DET_CORE_PORT": str(free_port()), "DET_JOB_ID": uuid.uuid4().hex}
    outs = [tmp_path / f"node{rank}.out" for rank in (0, 1)]
    nodes = [_launch(code, tmp_path / "two-nodes", config, {**shared, "DET_NODE_RANK": str(rank)}, outs[rank])
             for rank in (0, 1)]
    assert _finish(nodes) == [0, 0], "\n".join(out.read_text() for out in outs)
    assert _batches(outs[0]) == {0: list(range(8))}  # node 0 runs rank 0, node 1 runs rank 1
    assert _batches(outs[1]) == {1: list(range(8))}

    one_node = _launch(code, tmp_path / "one-node", config, {}, tmp_path / "one.out")
    assert _finish([one_node]) == [0], (tmp_path / "one.out").read_text()
    assert _batches(tmp_path / "one.out") == {0: list(range(8)), 1: list(range(8))}
    two = validation_losses(tmp_path / "two-nodes")
    assert len(two) == 2 and two == pytest.approx(validation_losses(tmp_path / "one-node"), rel=1e-6)
