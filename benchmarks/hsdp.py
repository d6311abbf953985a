"""The 2x1 HSDP mesh (``resources.mesh: {dp_replicate: 2}``) under ``Trainer.fit`` on 2 processes against a raw
FSDP2 loop on the same mesh, model, optimizer and batches: seconds per batch.

Usage: python benchmarks/hsdp.py [--rounds 21] [--batches 40] [--width 768] [--depth 4] [--quick]

Two gloo rank processes run the rounds. Each round, in an order that alternates between rounds, times (1)
``Trainer.fit`` of a trial that shards the model with ``fully_shard(mesh=mesh["dp_replicate", "dp_shard"])``
on ``context.get_device_mesh()`` (no checkpoints, a report every 20 batches) and (2) a raw loop: the same
model sharded the same way on ``init_device_mesh``, a ``DistributedSampler`` loader, forward, backward,
``step``, ``zero_grad``. Both time the batches from the start of batch ``_rounds.WARM`` to the start of the last
one (the harness's reports in between count; its start and its end-of-fit validation do not), and, within that,
the time outside the model's calls (the trial's whole ``train_batch``; the raw loop's forward to ``zero_grad``):
the batch's fetch, the loop and the harness's per-batch work, which the total's noise would swamp; and the CPU
time of all the process's threads (the harness's background threads included). Times are rank 0's; the ratio
is the median of per-round ratios, printed with a 95 % bootstrap interval for that median
(``_rounds.median_interval``): one round's ratio swings by several per cent on a shared 2-core machine, so it
takes about 20 rounds to tell a 3 % cost from none.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from _mse_trial import MSETrial
from _rounds import BatchTimes, Timed, run_rounds, summary
from fsdp import BATCH, launch_ranks
from torch import nn

from determined_trials import pytorch

__all__ = ["main", "parse_args", "raw_batches"]

REPORT = 20  # batches between the harness's metric reports


def _model(width: int, depth: int, mesh: Any) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, width))
                            for _ in range(depth)])
    dp = mesh["dp_replicate", "dp_shard"]
    for block in model:
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)
    return model


def _data(width: int) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(512, width, generator=gen), torch.randn(512, width, generator=gen)
    return torch.utils.data.TensorDataset(x, y)


class _Trial(MSETrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hp = context.get_hparams()
        self.model = context.wrap_model(_model(hp["width"], hp["depth"], context.get_device_mesh()))
        self.optimizer = context.wrap_optimizer(torch.optim.AdamW(self.model.parameters(), lr=1e-4))
        self.data = _data(hp["width"])
        self.times = BatchTimes()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.data, batch_size=BATCH, shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(torch.utils.data.Subset(self.data, range(2 * BATCH)), batch_size=BATCH)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
        began = self.times.start()
        loss = super().train_batch(batch, epoch_idx, batch_idx)
        self.times.inside.append(time.perf_counter() - began)
        return loss


def _harness(args: argparse.Namespace, run_dir: Path) -> Timed:
    hparams = {"global_batch_size": 2 * BATCH, "width": args.width, "depth": args.depth}
    config = {"hyperparameters": hparams, "reproducibility": {"experiment_seed": 1},
              "resources": {"slots_per_trial": 2, "mesh": {"dp_replicate": 2}},
              "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": args.batches}}}
    with pytorch.init(exp_conf=config, run_dir=str(run_dir), enable_tensorboard_logging=False) as context:
        trial = _Trial(context)
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(args.batches), reporting_period=pytorch.Batch(REPORT),
            checkpoint_period=pytorch.Batch(10**9), checkpoint_policy="none", show_progress=False)
        return trial.times.per_batch()


def _raw(args: argparse.Namespace, mesh: Any) -> Timed:
    model = _model(args.width, args.depth, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = BatchTimes()
    for x, y in raw_batches(_data(args.width), args.batches):
        began = times.start()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.inside.append(time.perf_counter() - began)
    return times.per_batch()


def raw_batches(data: torch.utils.data.Dataset[Any], batches: int) -> Iterator[Any]:
    """The raw loops' data: ``batches`` batches of ``BATCH`` records of this rank's ``DistributedSampler`` shard,
    epoch after epoch (shared with benchmarks/zero3.py)."""
    sampler: torch.utils.data.DistributedSampler[Any] = torch.utils.data.DistributedSampler(data, seed=1)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
    done, epoch = 0, 0
    while True:
        sampler.set_epoch(epoch)
        for batch in loader:
            yield batch
            done += 1
            if done == batches:
                return
        epoch += 1


def _rank_main(args: argparse.Namespace) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 1, 1), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    rows = run_rounds(args.rounds, lambda rnd: _harness(args, Path(args.out).parent / "runs" / f"round-{rnd}"),
                      lambda: _raw(args, mesh), "model calls", show=rank == 0)
    if rank == 0:
        Path(args.out).write_text(json.dumps(rows))


def parse_args(description: str, *, width: int) -> argparse.Namespace:
    """The arguments of a 2-rank per-batch benchmark (shared with benchmarks/zero3.py); ``--quick`` sets a smoke
    run's."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--width", type=int, default=width)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 8 batches of a small model")
    parser.add_argument("--out", help=argparse.SUPPRESS)  # set for the rank processes
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.batches, args.width, args.depth = 2, 8, 64, 2
    return args


def main() -> None:
    """Start the 2 ranks, wait, print the medians."""
    args = parse_args(__doc__.splitlines()[0], width=768)
    if args.out:
        _rank_main(args)
        return
    rows = launch_ranks(Path(__file__), sys.argv[1:], args.timeout, "cpu")
    print(f"\n2x1 HSDP mesh, 2 processes on cpu, {args.batches} batches of {2 * BATCH}, {args.rounds} rounds, "
          + summary(rows, "raw FSDP2 loop", "model calls"))


if __name__ == "__main__":
    main()
