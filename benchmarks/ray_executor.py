"""Experiments on Ray: the runner's overhead per trial and the store channel's throughput.

Usage: python benchmarks/ray_executor.py [--rounds 7] [--trials 3] [--writers 8] [--rows 400] [--quick]

- ``overhead``: per trial, the time from the runner creating the trial (just before it hands the
  trial to its executor) to the trial's first training-metric row in the store ("submit to first
  batch"), for the local executor and for the Ray executor (a Ray started in this process with
  ``ray.init(num_cpus=2)``, each trial one actor reporting over the store channel). Each round runs
  one experiment of ``--trials`` one-step trials per executor, one trial at a time, the order
  alternating between rounds; the round's ratio is Ray's median over local's median.
- ``channel``: ``--writers`` processes each append ``--rows`` metric rows as fast as they can, either
  over the store channel (``RemoteStore``) or straight into the SQLite store (the local path, the
  baseline); rows/s = all rows / (last writer done - first writer started). Per round, both modes
  (order alternating); the ratio is channel rows/s over direct rows/s.

- ``multinode``: submit to first batch of a 2-slot PyTorchTrial (``launch.torch_distributed``, gloo)
  spread over two Ray nodes (``resources.max_slots_per_node: 1``: one actor and one torchrun per node,
  joined by torchrun's multi-node rendezvous) against the same trial on one node (one actor, one
  torchrun with two processes), on a two-node Ray cluster started on this machine
  (``ray.cluster_utils.Cluster``: head 2 CPUs, second node 1 CPU); the first batch is the first
  training-metric row (``scheduling_unit: 1``). Per round one trial each (order alternating); the
  ratio is spread over one node.

Printed: each round's numbers, then the median of the per-round ratios. Run on a shared, busy
machine the numbers are noisy.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

_TRIAL = """
import determined_trials as det
with det.core.init() as ctx:
    for op in ctx.searcher.operations():
        ctx.train.report_training_metrics(steps_completed=1, metrics={"loss": 1.0})
        op.report_completed(1.0)
"""


def _overhead_ms(executor: str, trials: int, folder: Path) -> float:
    """Median submit-to-first-batch time of ``trials`` trials, in ms."""
    from determined_trials.core import LocalStore
    from determined_trials.experiment import Display, create_experiment

    ctx = folder / "ctx"
    ctx.mkdir(parents=True, exist_ok=True)
    (ctx / "train.py").write_text(_TRIAL)
    hparam = {"type": "int", "minval": 1, "maxval": trials, "count": trials}
    config = {"entrypoint": "python3 train.py", "hyperparameters": {"i": hparam},
              "searcher": {"name": "grid", "metric": "loss", "max_length": 1}}
    run_dir = folder / executor
    result = create_experiment(config, ctx, run_dir=run_dir, max_parallel=1, display=Display(progress=False),
                               ray="auto" if executor == "ray" else None)
    assert result.state == "COMPLETED", result
    store = LocalStore(run_dir)
    waits = []
    for trial in store.trials(result.experiment_id):
        first = store.metrics(trial.id, "training")[0]
        waits.append((first.reported_time - trial.start_time).total_seconds() * 1000)
    return statistics.median(waits)


_TORCH_TRIAL = """
import torch
from torch import nn
from torch.utils.data import TensorDataset

from determined_trials import pytorch


class Tiny(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(nn.Linear(4, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.05))

    def _data(self, size):
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        return pytorch.DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=size)

    def build_training_data_loader(self):
        return self._data(self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self):
        return self._data(8)

    def train_batch(self, batch, epoch_idx, batch_idx):
        loss = nn.functional.mse_loss(self.model(batch[0]), batch[1])
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        return {"validation_loss": nn.functional.mse_loss(self.model(batch[0]), batch[1])}
"""


def _multinode_ms(spread: bool, folder: Path, address: str) -> float:
    """Submit-to-first-batch of one 2-slot trial, spread over two nodes or on one, in ms."""
    from determined_trials.core import LocalStore
    from determined_trials.experiment import Display, create_experiment

    ctx = folder / "ctx"
    ctx.mkdir(parents=True, exist_ok=True)
    (ctx / "tiny.py").write_text(_TORCH_TRIAL)
    config = {"entrypoint": "python3 -m determined_trials.launch.torch_distributed --trial tiny.py:Tiny",
              "hyperparameters": {"global_batch_size": 8}, "scheduling_unit": 1,
              "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 2}},
              "resources": {"slots_per_trial": 2, "max_slots_per_node": 1 if spread else 2}}
    run_dir = folder / ("spread" if spread else "one")
    result = create_experiment(config, ctx, run_dir=run_dir, display=Display(progress=False), ray=address)
    assert result.state == "COMPLETED", result
    store = LocalStore(run_dir)
    (trial,) = store.trials(result.experiment_id)
    first = store.metrics(trial.id, "training")[0]
    return (first.reported_time - trial.start_time).total_seconds() * 1000


def _measure_multinode(rounds: int) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ratios = []
        for rnd in range(rounds):
            order = [False, True] if rnd % 2 == 0 else [True, False]
            with tempfile.TemporaryDirectory() as tmp:  # each experiment connects to the cluster and leaves
                ms = {spread: _multinode_ms(spread, Path(tmp), cluster.address) for spread in order}
            ratios.append(ms[True] / ms[False])
            print(f"round {rnd + 1}: 2-slot trial submit->first batch one node {ms[False]:.0f} ms, two nodes "
                  f"{ms[True]:.0f} ms, ratio {ratios[-1]:.2f}x", flush=True)
    finally:
        cluster.shutdown()
    print(f"multi-node start-up, two nodes / one node (2 slots): median of {rounds} round ratios "
          f"{statistics.median(ratios):.2f}x")


def _writer(address: str | None, run_dir: str, trial_id: int, rows: int, barrier: Any, out: Any) -> None:
    from determined_trials.core import LocalStore
    from determined_trials.core.channel._client import RemoteStore
    from determined_trials.core.channel._server import ChannelToken

    store: Any = RemoteStore(ChannelToken.loads(address), run_dir) if address else LocalStore(run_dir)
    store.trial(trial_id)  # connect before the clock starts
    barrier.wait()
    start = time.time()
    for step in range(rows):
        store.add_metrics(trial_id=trial_id, group="training", steps_completed=step, metrics={"loss": 0.5})
    out.put((start, time.time()))


def _rows_per_s(channel: bool, writers: int, rows: int, folder: Path) -> float:
    from determined_trials.core import LocalStore
    from determined_trials.core.channel._server import StoreChannelServer

    store = LocalStore(folder)
    exp = store.create_experiment(name="bench", config={})
    trials = [store.create_trial(experiment_id=exp, hparams={}, seed=i) for i in range(writers)]
    server = StoreChannelServer(store) if channel else None
    spawn = mp.get_context("spawn")
    barrier, out = spawn.Barrier(writers), spawn.Queue()
    token = server.token.dumps() if server else None
    procs = [spawn.Process(target=_writer, args=(token, str(folder), t, rows, barrier, out)) for t in trials]
    try:
        for proc in procs:
            proc.start()
        spans = [out.get(timeout=600) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
    finally:
        if server is not None:
            server.close()
    assert sum(len(store.metrics(t)) for t in trials) == writers * rows  # nothing dropped
    return writers * rows / (max(e for _, e in spans) - min(s for s, _ in spans))


def _measure(args: argparse.Namespace) -> None:
    if "RAY_AUTH_TOKEN" not in os.environ:  # a token of this run's, not one written into ~/.ray
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    overhead, channel = [], []
    try:
        for rnd in range(args.rounds):
            order = ["local", "ray"] if rnd % 2 == 0 else ["ray", "local"]
            with tempfile.TemporaryDirectory() as tmp:
                ms = {name: _overhead_ms(name, args.trials, Path(tmp) / name) for name in order}
            overhead.append(ms["ray"] / ms["local"])
            print(f"round {rnd + 1}: submit->first batch local {ms['local']:.0f} ms, ray {ms['ray']:.0f} ms, "
                  f"ratio {overhead[-1]:.2f}x", flush=True)
            modes = [False, True] if rnd % 2 == 0 else [True, False]
            with tempfile.TemporaryDirectory() as tmp:
                rate = {m: _rows_per_s(m, args.writers, args.rows, Path(tmp) / str(m)) for m in modes}
            channel.append(rate[True] / rate[False])
            print(f"round {rnd + 1}: {args.writers} writers: direct SQLite {rate[False]:.0f} rows/s, channel "
                  f"{rate[True]:.0f} rows/s, ratio {channel[-1]:.2f}x", flush=True)
    finally:
        ray.shutdown()
    _measure_multinode(args.rounds)
    print(f"runner overhead per trial, ray / local: median of {args.rounds} round ratios "
          f"{statistics.median(overhead):.2f}x")
    print(f"store channel throughput, channel / direct SQLite ({args.writers} writers): median of {args.rounds} "
          f"round ratios {statistics.median(channel):.2f}x")


def main() -> None:
    """Parse the options and run the interleaved rounds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--trials", type=int, default=3, help="trials per experiment (default 3)")
    parser.add_argument("--writers", type=int, default=8, help="concurrent metric writers (default 8)")
    parser.add_argument("--rows", type=int, default=400, help="metric rows per writer (default 400)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, 1 trial, 2 writers x 20 rows")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.trials, args.writers, args.rows = 1, 1, 2, 20
    _measure(args)


if __name__ == "__main__":
    main()
