"""The experiment runner's cost per trial: a search of many short trials, cold against warm trial processes,
and trial process start to its first batch, fresh and promoted.

Usage: python benchmarks/trial_start.py [--trials 100] [--only cold|warm] [--search-rounds 1] [--rounds 7] [--quick]

The search (``--trials N``, 0 to skip): ``det-trials experiment create`` of a random search of N trials of 20
batches that sleep 50 ms each (about one second of training; the loop's ``train`` time part measures it), one
trial at a time, with ``resources: {warm_processes: false}`` (cold: a new interpreter per trial) and with warm
trial processes (forked from a warm parent), in the same run (``--search-rounds N``: N searches per mode, the
modes interleaved, medians printed). Printed per search: experiment wall time (the ``experiment create``
command's, from its start to its exit) over the sum of the trials' training time (the store's ``train`` parts),
the same for the trials' own walls summed (queued to exit: the command's start-up and the runner's work between
trials left out), the median of each trial's seconds from the runner starting its process
(``DET_TRIAL_SPAWNED_AT``) to its first batch, and the summed time parts; then warm over cold.

Each round runs ``det-trials experiment create`` (cold trial processes: a warm one is forked ahead, so its
process start says nothing) on an adaptive ASHA search of 2 tiny PyTorchTrials
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
from typing import Any

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
    "resources": {"warm_processes": False},  # a new interpreter per trial: a warm one's process began long before
}


_SEARCH_TRIAL = '''
import json, os, time, torch
from determined_trials import pytorch

class SleepTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(4, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr")))
        self.data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))

    def build_training_data_loader(self):
        return pytorch.DataLoader(self.data, batch_size=8, shuffle=True)

    def build_validation_data_loader(self):
        return pytorch.DataLoader(self.data, batch_size=32)

    def train_batch(self, batch, epoch_idx, batch_idx):
        if batch_idx == 0:
            with open(os.environ["BENCH_OUT"], "a") as f:
                f.write(json.dumps({"to_first_batch": time.time() - float(os.environ["DET_TRIAL_SPAWNED_AT"])}) + "\\n")
        time.sleep(0.05)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return loss

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}
'''


def _search_config(trials: int, warm: bool) -> dict[str, Any]:
    return {
        "name": f"search-{'warm' if warm else 'cold'}", "entrypoint": "model_def:SleepTrial",
        "hyperparameters": {"global_batch_size": 8, "lr": {"type": "double", "minval": 0.001, "maxval": 0.1}},
        "searcher": {"name": "random", "metric": "validation_loss", "max_trials": trials,
                     "max_length": {"batches": 20}, "max_concurrent_trials": 1},
        "reproducibility": {"experiment_seed": 3}, "max_restarts": 0, "resources": {"warm_processes": warm},
    }


def _search(work: Path, trials: int, warm: bool) -> dict[str, float]:
    """One search; its wall, training sum, median start to first batch and summed time parts."""
    from determined_trials.core import LocalStore

    mode = "warm" if warm else "cold"
    folder = work / f"search-{mode}"
    (folder / "ctx").mkdir(parents=True)  # a fresh run folder per search
    (folder / "ctx" / "model_def.py").write_text(_SEARCH_TRIAL)
    (folder / "config.json").write_text(json.dumps(_search_config(trials, warm)))
    out = folder / "starts.jsonl"
    env = {**os.environ, "BENCH_OUT": str(out), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "determined_trials.cli.main", "--run-dir", str(folder / "run"), "experiment",
           "create", str(folder / "config.json"), str(folder / "ctx"), "--no-progress", "--max-parallel", "1"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"search failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    store = LocalStore(folder / "run")
    parts = store.experiment_time(store.experiments()[0].id, now=time.time())
    store.close()
    firsts = [json.loads(line)["to_first_batch"] for line in out.read_text().splitlines()]
    parts["trials_wall"] = parts.pop("wall")  # the trials' walls summed; the experiment's is the command's
    return {"wall": wall, "first_batch": statistics.median(firsts), "trials": len(firsts), **parts}


def _print_search(trials: int, work: Path, only: str | None, rounds: int) -> None:
    """``rounds`` searches per mode, the modes interleaved; each one's line, then the medians."""
    modes = [m for m in ("cold", "warm") if only in (None, m)]
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for rnd in range(rounds):
        for mode in modes if rnd % 2 == 0 else modes[::-1]:
            row = _search(work / f"round-{rnd}", trials, mode == "warm")
            rows[mode].append(row)
            print(f"round {rnd + 1}/{rounds}, search of {int(row['trials'])} trials, {mode}: experiment wall "
                  f"{row['wall']:.1f} s = {row['wall'] / row['train']:.3f}x the trials' training ({row['train']:.1f} s;"
                  f" their own walls summed {row['trials_wall'] / row['train']:.3f}x); trial start to first batch, "
                  f"median {row['first_batch']:.2f} s; summed parts: "
                  + ", ".join(f"{k} {row[k]:.1f} s" for k in ("queued", "start", "build", "train", "validation",
                                                               "checkpoint", "other", "trials_wall"))
                  + f"; goodput {row['goodput']:.2f}", flush=True)
    for mode, done in rows.items():
        ratios = sorted(row["wall"] / row["train"] for row in done)
        print(f"{mode}: experiment wall / the trials' training, median of {len(done)} searches "
              f"{statistics.median(ratios):.3f}x (searches {ratios[0]:.3f}-{ratios[-1]:.3f}); trial start to first "
              f"batch {statistics.median(row['first_batch'] for row in done):.2f} s", flush=True)
    if len(rows) == 2:
        pairs = list(zip(rows["cold"], rows["warm"]))
        wall = statistics.median(w["wall"] / c["wall"] for c, w in pairs)
        first = statistics.median(w["first_batch"] / c["first_batch"] for c, w in pairs)
        print(f"warm / cold: experiment wall {wall:.2f}x, trial start to first batch {first:.2f}x\n", flush=True)


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
    parser.add_argument("--trials", type=int, default=100, help="trials of the cold/warm search (0: skip it)")
    parser.add_argument("--only", choices=("cold", "warm"), help="run the search in this mode only")
    parser.add_argument("--search-rounds", type=int, default=1, help="searches per mode, interleaved (medians)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the ASHA start measurement (0: skip)")
    parser.add_argument("--quick", action="store_true", help="smoke run: a search of 4 trials, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.rounds = 4, 1
    if args.trials > 0:
        with tempfile.TemporaryDirectory(prefix="det-search-bench-") as tmp:
            _print_search(args.trials, Path(tmp), args.only, max(1, args.search_rounds))
    if args.rounds <= 0:
        return
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
