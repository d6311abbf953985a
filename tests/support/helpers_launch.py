"""The launcher tests' shared pieces: a tiny PyTorchTrial that prints a line per batch (``TRIAL`` and its
data module ``DATA``, written into a code folder), its config, the launcher as a subprocess (``Launch``,
every process it spawned watched) with the ``launches`` fixture that kills what a test leaves, and the
check that a job left no process behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import determined_trials as det

__all__ = ["BATCH_LINE", "DATA", "TRIAL", "Launch", "assert_nothing_left", "launches_fixture", "tiny_config",
           "validation_losses"]

TRIAL = '''
import os
import time

import torch
from torch import nn

from determined_trials import pytorch
from tiny_data import records


class TinyTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(nn.Linear(4, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.05))

    def build_training_data_loader(self):
        return pytorch.DataLoader(records(), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self):
        return pytorch.DataLoader(records(), batch_size=8)

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        rank = self.context.distributed.get_rank()
        print(f"rank {rank} trained batch {batch_idx}", flush=True)
        hp = self.context.get_hparams()
        if rank == hp.get("fail_rank") and batch_idx == hp.get("fail_at"):
            raise RuntimeError(f"boom in batch {batch_idx}")
        time.sleep(hp["sleep"])
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}
'''

DATA = '''
import torch
from torch.utils.data import TensorDataset


def records():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=gen)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))
'''

BATCH_LINE = re.compile(r"^\[rank=(\d)\] rank (\d) trained batch (\d+)$")


def tiny_config(folder: Path, name: str, slots: int, batches: int, **hparams: object) -> Path:
    hp = {"global_batch_size": 8, "sleep": 0.0, **hparams}
    path = folder / name
    path.write_text(textwrap.dedent(f"""
        hyperparameters: {hp!r}
        searcher: {{name: single, metric: validation_loss, max_length: {{batches: {batches}}}}}
        min_validation_period: {{batches: 4}}
        resources: {{slots_per_trial: {slots}}}
        reproducibility: {{experiment_seed: 7}}
    """).replace("'", ""))
    return path


class Launch:
    """The launcher as a subprocess: its output lines with arrival times, and every process it spawned."""

    def __init__(self, args: list[str], cwd: Path, run_dir: Path, launcher: str = "torch_distributed") -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
        env["DET_RUN_DIR"] = str(run_dir)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"determined_trials.launch.{launcher}", *args], cwd=cwd, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[tuple[float, str]] = []
        self.spawned: dict[int, float] = {}  # pid -> create time (to tell a reused pid apart)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def _watch(self) -> None:
        while self.proc.poll() is None:
            try:
                for child in psutil.Process(self.proc.pid).children(recursive=True):
                    self.spawned.setdefault(child.pid, child.create_time())
            except psutil.Error:
                pass
            time.sleep(0.05)

    def wait_for(self, pattern: str, timeout: float = 120) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for stamp, line in list(self.lines):
                if re.search(pattern, line):
                    return stamp
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"no line matching {pattern!r}; output:\n{self.output}")

    def finish(self, timeout: float = 180) -> tuple[int, float]:
        returncode = self.proc.wait(timeout=timeout)
        ended = time.monotonic()
        self._reader.join(10)
        return returncode, ended

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def batches(self) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        for _, line in self.lines:
            match = BATCH_LINE.match(line)
            if match:
                assert match.group(1) == match.group(2), line  # the prefix names the rank that printed it
                found.setdefault(int(match.group(1)), []).append(int(match.group(3)))
        return found

    def left_behind(self) -> list[int]:
        alive = []
        for pid, created in self.spawned.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.Error:
                pass
        return alive

    def kill(self) -> None:
        pids = list(self.spawned)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in pids:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


@pytest.fixture(name="launches")
def launches_fixture() -> Iterator[list[Launch]]:
    """The ``launches`` fixture: the Launches a test starts, every one killed when it ends."""
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.kill()


def _job_processes(marker: Path) -> list[str]:
    """Command lines of live processes that mention ``marker`` (the test's folder)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(marker) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(cmdline)
    return found


def assert_nothing_left(launch: Launch, tmp_path: Path) -> None:
    time.sleep(0.2)
    assert launch.spawned, "the watcher saw no worker process"
    assert launch.left_behind() == []
    assert _job_processes(tmp_path) == []


def validation_losses(run_dir: Path) -> list[float]:
    store = det.core.LocalStore(run_dir)
    (trial,) = store.trials()
    return [m.metrics["validation_loss"] for m in store.metrics(trial.id, group="validation")]
