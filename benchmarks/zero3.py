"""A DeepSpeedTrial with ZeRO stage 3 under ``Trainer.fit`` on 2 processes against a raw DeepSpeed engine loop
on the same model, config and batches: seconds per batch.

Usage: python benchmarks/zero3.py [--rounds 21] [--batches 40] [--width 256] [--depth 4] [--quick]

Two gloo rank processes (DeepSpeed's CPU accelerator, ``DET_DEEPSPEED_SHM_COMM=0``: no JIT-built shm op) run
the rounds. Both sides build the MLP of ``hsdp.py`` (``--depth`` blocks of width -> 2 width -> width; 1.1M
parameters by default, so that a batch takes tens of milliseconds and per-batch harness costs show)
partitioned (``zero.Init``; ``context.zero_init`` in the trial) into a ZeRO-3 engine (``torch_adam``, no
offload, micro-batch ``BATCH`` a rank, no accumulation: a batch is ``2 * BATCH`` records and one step). Each
round, in an order that alternates between rounds, times (1) ``Trainer.fit`` of a DeepSpeedTrial over a
``det.pytorch.DataLoader`` (no checkpoints, a report every 20 batches) and (2) a raw loop: a
``DistributedSampler`` loader, ``engine(x)``, ``engine.backward``, ``engine.step``. Both time the batches
from the start of batch ``_rounds.WARM`` to the start of the last one (the harness's reports in between count;
engine building, its start and its end-of-fit validation do not), and, within that, the time outside the
engine calls (fetching the batch, the loop, the harness's per-batch work) and the CPU time of all the process's
threads (the harness's background threads included). Times are rank 0's; the ratio is the median of per-round
ratios, with its 95 % bootstrap interval (see ``hsdp.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("DET_DEEPSPEED_SHM_COMM", "0")  # launch_ranks drops DET_* variables: set in each rank
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
from _rounds import BatchTimes, Timed, run_rounds, summary  # noqa: E402
from fsdp import BATCH, launch_ranks  # noqa: E402
from hsdp import REPORT, parse_args, raw_batches  # noqa: E402
from torch import nn  # noqa: E402

from determined_trials import deepspeed as det_ds  # noqa: E402
from determined_trials import pytorch  # noqa: E402

__all__ = ["main"]


def _ds_config() -> dict[str, Any]:
    return {"train_batch_size": 2 * BATCH, "train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
            "zero_optimization": {"stage": 3}, "steps_per_print": 10**9, "wall_clock_breakdown": False}


def _mlp(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, width))
                           for _ in range(depth)])


def _engine(model: nn.Module) -> Any:
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=_ds_config())
    return engine


def _data(width: int) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(512, width, generator=gen), torch.randn(512, width, generator=gen)
    return torch.utils.data.TensorDataset(x, y)


class _Trial(det_ds.DeepSpeedTrial):
    def __init__(self, context: det_ds.DeepSpeedTrialContext) -> None:
        self.context = context
        hp = context.get_hparams()
        with context.zero_init(_ds_config()):
            model = _mlp(hp["width"], hp["depth"])
        self.engine = context.wrap_model_engine(_engine(model))
        self.data = _data(hp["width"])
        self.times = BatchTimes()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.data, batch_size=BATCH, shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(torch.utils.data.Subset(self.data, range(2 * BATCH)), batch_size=BATCH)

    def train_batch(self, dataloader_iter: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
        self.times.start()
        x, y = next(dataloader_iter)
        began = time.perf_counter()
        loss = nn.functional.mse_loss(self.engine(x), y)
        self.engine.backward(loss)
        self.engine.step()
        self.times.inside.append(time.perf_counter() - began)
        return loss

    def evaluate_batch(self, dataloader_iter: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = next(dataloader_iter)
        return {"validation_loss": nn.functional.mse_loss(self.engine(x), y)}


def _harness(args: argparse.Namespace, run_dir: Path) -> Timed:
    hparams = {"global_batch_size": 2 * BATCH, "width": args.width, "depth": args.depth}
    config = {"hyperparameters": hparams, "reproducibility": {"experiment_seed": 1},
              "resources": {"slots_per_trial": 2},
              "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": args.batches}}}
    with det_ds.init(exp_conf=config, run_dir=str(run_dir), enable_tensorboard_logging=False) as context:
        trial = _Trial(context)
        det_ds.Trainer(trial, context).fit(
            max_length=det_ds.Batch(args.batches), reporting_period=det_ds.Batch(REPORT),
            checkpoint_period=det_ds.Batch(10**9), checkpoint_policy="none", show_progress=False)
        trial.engine.destroy()  # ZeRO-3's hooks, as the raw loop's
        return trial.times.per_batch()


def _raw(args: argparse.Namespace) -> Timed:
    import deepspeed

    with deepspeed.zero.Init(config_dict_or_path=_ds_config()):
        model = _mlp(args.width, args.depth)
    engine = _engine(model)
    times = BatchTimes()
    for x, y in raw_batches(_data(args.width), args.batches):
        began = times.start()
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        times.inside.append(time.perf_counter() - began)
    engine.destroy()  # ZeRO-3's hooks, as the trial's
    return times.per_batch()


def _rank_main(args: argparse.Namespace) -> None:
    from determined_trials.deepspeed._distributed import start_deepspeed_distributed

    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "`torch.distributed.* is deprecated", FutureWarning)  # DeepSpeed's calls
    start_deepspeed_distributed()  # gloo through DeepSpeed, for both sides
    rows = run_rounds(args.rounds, lambda rnd: _harness(args, Path(args.out).parent / "runs" / f"round-{rnd}"),
                      lambda: _raw(args), "engine calls", show=rank == 0)
    if rank == 0:
        Path(args.out).write_text(json.dumps(rows))


def main() -> None:
    """Start the 2 ranks, wait, print the medians."""
    args = parse_args(__doc__.splitlines()[0], width=256)
    if args.out:
        _rank_main(args)
        return
    rows = launch_ranks(Path(__file__), sys.argv[1:], args.timeout, "cpu")
    params = args.depth * (4 * args.width * args.width + 3 * args.width)
    print(f"\nZeRO-3, {params / 1e6:.1f}M parameters, 2 processes on cpu (gloo), {args.batches} batches of "
          f"{2 * BATCH}, {args.rounds} rounds, " + summary(rows, "raw DeepSpeed loop", "engine calls"))


if __name__ == "__main__":
    main()
