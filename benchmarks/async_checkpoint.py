"""How long ``Trainer.fit`` holds the training loop per checkpoint, against a plain ``torch.save``.

Usage: python benchmarks/async_checkpoint.py [--rounds 7] [--batches 500] [--period 100] [--quick]

A ~50 MB model (three 2048x2048 linear layers, float32) with SGD momentum (as much state again)
is trained for ``--batches`` batches of 4 with a checkpoint every ``--period``. Blocked time is the
wall time the training thread spends in the loop's checkpoint step (the snapshot, plus any wait for
the previous write) and in collecting finished writes, for every checkpoint taken while training
goes on; the last one (at the end of fit, written at once since nothing is left to overlap) is
not counted. The baseline, measured in the same round and process: ``torch.save`` of the same
model and optimizer state into the same folder. Rounds alternate async and synchronous fits; the
ratios are medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _mse_trial import MSETrial
from torch import nn

from determined_trials import pytorch
from determined_trials.loop import _checkpointing

__all__ = ["main"]

WIDTH, BATCH = 2048, 4


class _BigTrial(MSETrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                              nn.Linear(WIDTH, WIDTH))
        self.model = context.wrap_model(model)
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=1e-4, momentum=0.9))
        self.data = torch.utils.data.TensorDataset(torch.randn(256, WIDTH), torch.randn(256, WIDTH))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.data, batch_size=BATCH, shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(torch.utils.data.TensorDataset(self.data.tensors[0][:8], self.data.tensors[1][:8]),
                                  batch_size=8)


class _Timer:
    """Wall time the training thread spends in Checkpointer.save / poll, and in the final wait."""

    def __init__(self) -> None:
        self.blocked, self.calls, self.final = 0.0, 0, 0.0
        cls = _checkpointing.Checkpointer
        self._originals = {name: getattr(cls, name) for name in ("save", "poll")}

    def __enter__(self) -> _Timer:
        cls = _checkpointing.Checkpointer
        for name, original in self._originals.items():
            setattr(cls, name, self._timed(original, name == "save"))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(_checkpointing.Checkpointer, name, original)

    def _timed(self, original: Any, counts: bool) -> Any:
        def timed(checkpointer: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(checkpointer, *args, **kwargs)
            finally:
                if kwargs.get("final"):  # the end of fit: written at once, nothing left to overlap
                    self.final += time.perf_counter() - start
                else:
                    self.blocked += time.perf_counter() - start
                    self.calls += counts

        return timed


def _fit(args: argparse.Namespace, run_dir: Path, asynchronous: bool) -> tuple[float, float, Any]:
    config = {"hyperparameters": {"global_batch_size": BATCH}, "reproducibility": {"experiment_seed": 1},
              "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": args.batches}}}
    with pytorch.init(exp_conf=config, run_dir=str(run_dir), enable_tensorboard_logging=False) as context:
        trial = _BigTrial(context)
        if not asynchronous:
            context.experimental.disable_async_checkpoints()
        with _Timer() as timer:
            start = time.perf_counter()
            pytorch.Trainer(trial, context).fit(
                max_length=pytorch.Batch(args.batches), checkpoint_period=pytorch.Batch(args.period),
                checkpoint_policy="none", show_progress=False)
            total = time.perf_counter() - start
    return timer.blocked / max(1, timer.calls), total, trial


def _plain_save(trial: Any, folder: Path) -> float:
    start = time.perf_counter()
    torch.save({"model": trial.model.state_dict(), "optimizer": trial.optimizer.state_dict()}, folder / "plain.pth")
    return time.perf_counter() - start


def main() -> None:
    """Run the rounds and print per-checkpoint blocking against a plain torch.save."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--period", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 20 batches")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.batches, args.period = 2, 20, 10
    torch.set_num_threads(1)
    rows: dict[str, list[float]] = {"async": [], "sync": [], "plain": [], "async_ratio": [], "sync_ratio": []}
    with tempfile.TemporaryDirectory(prefix="det-async-bench-") as tmp:
        for rnd in range(args.rounds):
            run_dir = Path(tmp, f"round-{rnd}")
            order = (True, False) if rnd % 2 == 0 else (False, True)
            blocked: dict[bool, float] = {}
            for asynchronous in order:
                blocked[asynchronous], _, trial = _fit(args, run_dir, asynchronous)
            plain = statistics.median(_plain_save(trial, run_dir) for _ in range(3))
            for key, value in (("async", blocked[True]), ("sync", blocked[False]), ("plain", plain)):
                rows[key].append(value)
            rows["async_ratio"].append(blocked[True] / plain)
            rows["sync_ratio"].append(blocked[False] / plain)
            print(f"round {rnd + 1}/{args.rounds}: blocked per checkpoint async {blocked[True] * 1e3:.1f} ms, "
                  f"sync {blocked[False] * 1e3:.1f} ms; plain torch.save {plain * 1e3:.1f} ms", flush=True)
    size_mb = sum(p.numel() * 4 for p in trial.model.parameters()) / 1e6
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\nmodel {size_mb:.0f} MB (+ as much SGD momentum), checkpoint every {args.period} of {args.batches} "
          f"batches, {args.rounds} rounds, medians:")
    print(f"async checkpoint blocks the loop {med['async'] * 1e3:.1f} ms per checkpoint; synchronous "
          f"{med['sync'] * 1e3:.1f} ms; plain torch.save {med['plain'] * 1e3:.1f} ms")
    print(f"async blocking fraction (median of per-round ratios to torch.save): {med['async_ratio']:.3f}; "
          f"synchronous: {med['sync_ratio']:.3f}")


if __name__ == "__main__":
    main()
