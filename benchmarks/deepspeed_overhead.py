"""Training-time overhead of a DeepSpeedTrial run by ``Trainer.fit`` over a hand-written DeepSpeed engine
loop doing the same work, for ZeRO stage 0 and stage 2, in one process.

Usage: DET_DEEPSPEED_SHM_COMM=0 python benchmarks/deepspeed_overhead.py [--rounds 7] [--batches 1000] [--quick]

Both run the MLP and synthetic data of ``overhead.py`` as a DeepSpeed engine (``torch_adam``, micro-batch
32, 2 gradient-accumulation steps, so a batch is 64 records), for ``--batches`` batches, reporting the
training loss every 100 batches (one host sync) and validating every 200, and both end with one engine
``save_checkpoint``:

- ``raw``    a loop over a shuffled torch DataLoader: ``engine(x)``, ``engine.backward``, ``engine.step``;
- ``trial``  the same as a DeepSpeedTrial through ``Trainer.fit(max_length=Batch(n), ...)`` (its checkpoint
             also holds the harness state: trial state, RNGs, ``load_data.json``).

Per stage, each round times both (fresh engines, built outside the timing; the order alternates) and the
result is the median over rounds of the per-round ratio trial / raw. Timing: ``time.perf_counter()``
around the training call only. ``torch.set_num_threads(1)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DET_DEEPSPEED_SHM_COMM", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import _datasets, _mlp  # noqa: E402  (the same model and data as the PyTorch benchmark)

__all__ = ["main"]

MICRO, GAS, REPORT, PERIOD, LR = 32, 2, 100, 200, 0.001


def _ds_config(stage: int) -> dict[str, Any]:
    return {"train_batch_size": MICRO * GAS, "train_micro_batch_size_per_gpu": MICRO,
            "gradient_accumulation_steps": GAS, "optimizer": {"type": "Adam", "params": {"lr": LR, "torch_adam": True}},
            "zero_optimization": {"stage": stage}, "steps_per_print": 10**9}


def _engine(stage: int) -> Any:
    import deepspeed

    model = _mlp()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=_ds_config(stage))
    return engine


def _raw(stage: int, batches: int, out: Path) -> float:
    import torch
    from torch import nn

    train, val = _datasets()
    engine = _engine(stage)
    start = time.perf_counter()
    loader = torch.utils.data.DataLoader(train, batch_size=MICRO, shuffle=True,
                                         generator=torch.Generator().manual_seed(0), drop_last=True)
    losses: list[Any] = []
    done = 0
    while done < batches:
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.detach())
            if (step + 1) % GAS:
                continue
            done += 1
            if done % REPORT == 0:
                torch.stack(losses).mean().item()
                losses = []
            if done % PERIOD == 0:
                _validate(engine, val)
            if done == batches:
                break
    engine.save_checkpoint(str(out), tag="model0")
    return time.perf_counter() - start


def _validate(engine: Any, val: Any) -> float:
    import torch

    engine.eval()
    correct = torch.zeros(())
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(val, batch_size=256):
            correct += (engine(x).argmax(dim=1) == y).sum()
    engine.train()
    return correct.item() / len(val)


def _trial_class() -> type:
    import torch
    from torch import nn

    from determined_trials import deepspeed as det_ds
    from determined_trials import pytorch

    class BenchTrial(det_ds.DeepSpeedTrial):
        def __init__(self, context: det_ds.DeepSpeedTrialContext) -> None:
            self.context = context
            self.engine = context.wrap_model_engine(_engine(context.get_hparam("stage")))
            self.train_data, self.val_data = _datasets()

        def build_training_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(self.train_data, batch_size=MICRO, shuffle=True)

        def build_validation_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(self.val_data, batch_size=256)

        def train_batch(self, dataloader_iter: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            x, y = next(dataloader_iter)
            loss = nn.functional.cross_entropy(self.engine(x), y)
            self.engine.backward(loss)
            self.engine.step()
            return loss

        def evaluate_batch(self, dataloader_iter: Any, batch_idx: int) -> dict[str, torch.Tensor]:
            x, y = next(dataloader_iter)
            return {"validation_accuracy": (self.engine(x).argmax(dim=1) == y).float().mean()}

    return BenchTrial


def _trial(stage: int, batches: int, run_dir: Path) -> float:
    from determined_trials import deepspeed as det_ds

    config = {"hyperparameters": {"stage": stage, "global_batch_size": MICRO * GAS},
              "searcher": {"name": "single", "metric": "validation_accuracy", "max_length": {"batches": batches}}}
    with det_ds.init(exp_conf=config, run_dir=run_dir) as context:
        trial = _trial_class()(context)
        trainer = det_ds.Trainer(trial, context)
        start = time.perf_counter()
        trainer.fit(max_length=det_ds.Batch(batches), validation_period=det_ds.Batch(PERIOD),
                    reporting_period=det_ds.Batch(REPORT), checkpoint_policy="none", show_progress=False)
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 40 batches (a smoke run, not a measurement)")
    args = parser.parse_args(argv)
    rounds, batches = (2, 40) if args.quick else (args.rounds, args.batches)
    import logging

    import torch

    from determined_trials.deepspeed._distributed import start_deepspeed_distributed

    torch.set_num_threads(1)
    start_deepspeed_distributed()  # the raw loop needs a process group of one too (deepspeed.initialize)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    logging.getLogger("determined_trials").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="det-ds-bench-") as tmp:
        for stage in (0, 2):
            ratios, raw_times, trial_times = [], [], []
            for r in range(rounds):
                first_raw = r % 2 == 0
                for kind in (("raw", "trial") if first_raw else ("trial", "raw")):
                    where = Path(tmp, f"z{stage}-{r}-{kind}")
                    seconds = _raw(stage, batches, where) if kind == "raw" else _trial(stage, batches, where)
                    (raw_times if kind == "raw" else trial_times).append(seconds)
                ratios.append(trial_times[-1] / raw_times[-1])
            print(f"zero{stage} raw    median {statistics.median(raw_times):.3f} s  ({len(raw_times)} rounds)")
            print(f"zero{stage} trial  median {statistics.median(trial_times):.3f} s")
            print(f"zero{stage} trial / raw: median of per-round ratios {statistics.median(ratios):.3f}x "
                  f"(min {min(ratios):.3f}, max {max(ratios):.3f}; {batches} batches of {MICRO * GAS} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
