"""How long ``Trainer.fit`` holds the training loop per checkpoint, against a plain ``torch.save``.

Usage: python benchmarks/async_checkpoint.py [--rounds 7] [--batches 500] [--period 100] [--quick]
                                            [--device cuda] [--width 2048] [--optimizer sgd|adamw] [--batch 4]

A ~50 MB model (three 2048x2048 linear layers, float32; ``--width`` changes the size) with SGD
momentum (as much state again; ``--optimizer adamw``: twice as much) is trained for ``--batches``
batches of 4 (``--batch``) with a checkpoint every ``--period``, on ``--device``. Blocked time is the wall time
the training thread spends in the loop's checkpoint step (the snapshot, plus any wait for the
previous write) and in collecting finished writes, for every checkpoint taken while training goes
on, the first one of a fit (whose host buffers were prepared off the training thread) shown apart
too. The last checkpoint (at the end of fit, written at once since nothing is left to overlap) is
reported apart: the wait for the write still in flight, then its own write, against ``torch.save``
+ fsync of the same state. The baselines, measured in the same round and process: ``torch.save``
of the same model and optimizer state into the same folder (with and without an fsync). Rounds
alternate async and synchronous fits; the ratios are medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _checkpoint_timer import CheckpointTimer
from _mse_trial import MSETrial
from torch import nn

from determined_trials import pytorch

__all__ = ["main"]

class _BigTrial(MSETrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        width, optimizer = context.get_hparam("width"), context.get_hparam("optimizer")
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                              nn.Linear(width, width))
        self.model = context.wrap_model(model)
        params = self.model.parameters()
        adamw = optimizer == "adamw"
        self.optimizer = context.wrap_optimizer(
            torch.optim.AdamW(params, lr=1e-4) if adamw else torch.optim.SGD(params, lr=1e-4, momentum=0.9))
        device = context.device  # the data already on the device: the benchmark times checkpoints, not copies
        rows = max(256, 2 * context.get_per_slot_batch_size())
        self.data = torch.utils.data.TensorDataset(torch.randn(rows, width, device=device),
                                                   torch.randn(rows, width, device=device))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.data, batch_size=self.context.get_per_slot_batch_size(), shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(torch.utils.data.TensorDataset(self.data.tensors[0][:8], self.data.tensors[1][:8]),
                                  batch_size=8)


def _fit(args: argparse.Namespace, run_dir: Path, asynchronous: bool) -> tuple[CheckpointTimer, Any]:
    hparams = {"global_batch_size": args.batch, "width": args.width, "optimizer": args.optimizer}
    config = {"hyperparameters": hparams, "reproducibility": {"experiment_seed": 1},
              "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": args.batches}}}
    with pytorch.init(exp_conf=config, run_dir=str(run_dir), enable_tensorboard_logging=False) as context:
        trial = _BigTrial(context)
        if not asynchronous:
            context.experimental.disable_async_checkpoints()
        assert context.device.type == args.device, f"the trial trains on {context.device}, not {args.device}"
        with CheckpointTimer() as timer:
            pytorch.Trainer(trial, context).fit(
                max_length=pytorch.Batch(args.batches), checkpoint_period=pytorch.Batch(args.period),
                checkpoint_policy="none", show_progress=False)
    return timer, trial


def _plain_save(trial: Any, folder: Path, fsync: bool) -> float:
    """``torch.save`` of the model and optimizer state into a new file, as a user's checkpoints are
    written (then an fsync); the files stay until the round ends. Rewriting one file over and over is not
    the baseline: the file system reuses its blocks, which measured up to ~3x faster on this project's
    machines than a new file."""
    if trial.context.device.type == "cuda":
        torch.cuda.synchronize()  # not the training's queued kernels
    path = folder / f"plain-{time.monotonic_ns()}.pth"
    start = time.perf_counter()
    with open(path, "wb") as file:
        torch.save({"model": trial.model.state_dict(), "optimizer": trial.optimizer.state_dict()}, file)
        if fsync:
            file.flush()
            os.fsync(file.fileno())
    return time.perf_counter() - start


def _round(args: argparse.Namespace, run_dir: Path, rnd: int) -> dict[str, float]:
    """One round: an async and a synchronous fit (order alternating), then the plain baselines."""
    order = (True, False) if rnd % 2 == 0 else (False, True)
    timers: dict[bool, CheckpointTimer] = {}
    for asynchronous in order:
        timers[asynchronous], trial = _fit(args, run_dir, asynchronous)
    if args.device == "cuda":
        torch.cuda.synchronize()
    plain = statistics.median(_plain_save(trial, run_dir, fsync=False) for _ in range(3))
    plain_fsync = statistics.median(_plain_save(trial, run_dir, fsync=True) for _ in range(3))
    for path in run_dir.glob("plain-*.pth"):
        path.unlink()
    held, sync = timers[True], timers[False]
    row = {"async": held.per_checkpoint, "first": held.first, "sync": sync.per_checkpoint,
           "final_wait": held.final_wait, "final": held.final, "plain": plain, "plain_fsync": plain_fsync}
    row.update(async_ratio=row["async"] / plain, first_ratio=row["first"] / plain, sync_ratio=row["sync"] / plain,
               final_ratio=row["final"] / plain_fsync)
    print(f"round {rnd + 1}/{args.rounds}: held per checkpoint async {row['async'] * 1e3:.1f} ms (first "
          f"{row['first'] * 1e3:.1f}), sync {row['sync'] * 1e3:.1f} ms; last checkpoint {row['final'] * 1e3:.1f} ms "
          f"after {row['final_wait'] * 1e3:.1f} ms waiting for the write in flight; torch.save {plain * 1e3:.1f} ms, "
          f"+ fsync {plain_fsync * 1e3:.1f} ms", flush=True)
    return row


def main() -> None:
    """Run the rounds and print per-checkpoint blocking against a plain torch.save."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--period", type=int, default=100)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the trial trains")
    parser.add_argument("--width", type=int, default=2048, help="units of each of the three linear layers")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd", help="SGD momentum or AdamW")
    parser.add_argument("--batch", type=int, default=4,
                        help="records a batch: on a GPU, enough for the writes to finish between checkpoints")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 20 batches")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.batches, args.period = 2, 20, 10
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before CUDA is first queried: the context picks the CPU
    torch.set_num_threads(1)
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="det-async-bench-") as tmp:
        for rnd in range(args.rounds):
            for key, value in _round(args, Path(tmp, f"round-{rnd}"), rnd).items():
                rows.setdefault(key, []).append(value)
    _report(args, {k: statistics.median(v) for k, v in rows.items()})


def _report(args: argparse.Namespace, med: dict[str, float]) -> None:
    params = 3 * (args.width * args.width + args.width)
    state_mb = params * 4 * (3 if args.optimizer == "adamw" else 2) / 1e6
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"\n{device}: model + {args.optimizer} state {state_mb:.0f} MB, checkpoint every {args.period} of "
          f"{args.batches} batches, {args.rounds} rounds, medians:")
    print(f"async checkpoint holds the loop {med['async'] * 1e3:.1f} ms per checkpoint (the first "
          f"{med['first'] * 1e3:.1f} ms); synchronous {med['sync'] * 1e3:.1f} ms; plain torch.save "
          f"{med['plain'] * 1e3:.1f} ms, + fsync {med['plain_fsync'] * 1e3:.1f} ms")
    print(f"async blocking fraction (median of per-round ratios to torch.save): {med['async_ratio']:.3f}; "
          f"first checkpoint: {med['first_ratio']:.3f}; synchronous: {med['sync_ratio']:.3f}")
    print(f"last checkpoint of fit: {med['final'] * 1e3:.1f} ms, {med['final_ratio']:.3f} of torch.save + fsync "
          f"(median of per-round ratios), after {med['final_wait'] * 1e3:.1f} ms waiting for the write in flight")


if __name__ == "__main__":
    main()
