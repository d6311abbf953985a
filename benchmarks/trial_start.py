"""The experiment runner's cost per trial: trial process start to its first batch, fresh and promoted.

Usage: python benchmarks/trial_start.py [--rounds 7] [--quick]

Each round runs ``det-trials experiment create`` on an adaptive ASHA search of 2 tiny PyTorchTrials
(2 rungs, divisor 2: both trials to 4 batches, the better one promoted and resumed from its checkpoint
in a new process to 8 batches) and, interleaved, a plain script doing the same import and one
training step. Each trial process writes the seconds from its own start (``/proc/self/stat``) to
its first ``train_batch``; the plain script the same. Also printed: the experiment's wall time per
trial process. Ratios are medians of per-round ratios to the plain script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

_SINCE_START = '''
import os, time
def since_process_start():
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return time.time() - (boot + ticks / os.sysconf("SC_CLK_TCK"))
'''

_TRIAL = _SINCE_START + '''
import json, torch
from torch import nn
from determined_trials import pytorch

class TinyTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context, self.first = context, True
        self.model = context.wrap_model(nn.Linear(4, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr")))
        self.data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))

    def build_training_data_loader(self):
        return pytorch.DataLoader(self.data, batch_size=8, shuffle=True)

    def build_validation_data_loader(self):
        return pytorch.DataLoader(self.data, batch_size=32)

    def train_batch(self, batch, epoch_idx, batch_idx):
        if self.first:
            self.first = False
            with open(os.environ["BENCH_OUT"], "a") as f:
                f.write(json.dumps({"since_start": since_process_start(), "batch_idx": batch_idx}) + "\\n")
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return loss

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}
'''

_PLAIN = _SINCE_START + '''
import json, sys, torch
from torch import nn
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1)),
                                        batch_size=8, shuffle=True):
    print(json.dumps({"since_start": since_process_start()}))
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    break
'''

_CONFIG = {
    "name": "trial-start-bench", "entrypoint": "model_def:TinyTrial",
    "hyperparameters": {"global_batch_size": 8, "lr": {"type": "double", "minval": 0.001, "maxval": 0.1}},
    "searcher": {"name": "adaptive_asha", "metric": "validation_loss", "max_trials": 2, "max_rungs": 2,
                 "divisor": 2, "max_length": {"batches": 8}, "max_concurrent_trials": 1},
    "reproducibility": {"experiment_seed": 3}, "max_restarts": 0,
}


def _experiment(work: Path) -> tuple[list[dict[str, float]], float]:
    out = work / "starts.jsonl"
    env = {**os.environ, "BENCH_OUT": str(out), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "determined_trials.cli.main", "--run-dir", str(work / "run"), "experiment",
           "create", str(work / "config.json"), str(work / "ctx"), "--no-progress"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"experiment failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    starts = [json.loads(line) for line in out.read_text().splitlines()]
    out.unlink()
    return starts, wall


def _plain(work: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(work / "plain.py")], capture_output=True, text=True, env=env,
                          timeout=300, check=True)
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["since_start"])


def main() -> None:
    """Run the interleaved rounds; print the trial start cost against a plain script's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    rows: dict[str, list[float]] = {"fresh": [], "promoted": [], "plain": [], "per_process": []}
    with tempfile.TemporaryDirectory(prefix="det-start-bench-") as tmp:
        work = Path(tmp)
        (work / "ctx").mkdir()
        (work / "ctx" / "model_def.py").write_text(_TRIAL)
        (work / "plain.py").write_text(_PLAIN)
        (work / "config.json").write_text(json.dumps(_CONFIG))
        for rnd in range(args.rounds):
            plain_first = rnd % 2 == 1
            plain = _plain(work) if plain_first else 0.0
            starts, wall = _experiment(work)
            plain = plain if plain_first else _plain(work)
            fresh = [s["since_start"] for s in starts if s["batch_idx"] == 0]
            promoted = [s["since_start"] for s in starts if s["batch_idx"] > 0]
            rows["fresh"].append(statistics.median(fresh))
            rows["promoted"].append(statistics.median(promoted) if promoted else float("nan"))
            rows["plain"].append(plain)
            rows["per_process"].append(wall / len(starts))
            print(f"round {rnd + 1}/{args.rounds}: {len(fresh)} fresh + {len(promoted)} promoted trial processes; "
                  f"start to first batch {rows['fresh'][-1]:.2f} s fresh, {rows['promoted'][-1]:.2f} s promoted, "
                  f"plain script {plain:.2f} s; experiment wall {wall:.1f} s", flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    fresh_ratio = statistics.median(f / p for f, p in zip(rows["fresh"], rows["plain"]))
    promoted_ratio = statistics.median(f / p for f, p in zip(rows["promoted"], rows["plain"]))
    print(f"\ntrial process start to first batch, {args.rounds} rounds, medians: fresh {med['fresh']:.2f} s "
          f"({fresh_ratio:.2f}x a plain torch script's {med['plain']:.2f} s), promoted (resumed) "
          f"{med['promoted']:.2f} s ({promoted_ratio:.2f}x); experiment wall time per trial process "
          f"{med['per_process']:.2f} s")


if __name__ == "__main__":
    main()
