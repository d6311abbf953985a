"""Time to the first batch after resuming, near the start and deep into a 10M-record dataset.

Usage: python benchmarks/resume_cost.py [--rounds 7] [--records 10000000] [--deep 1000000] [--quick]

A synthetic dataset of ``--records`` records (computed from the index, nothing in memory), shuffled,
batches of 32. One fit trains 10 batches and checkpoints; a second checkpoint with the same state
but positioned at batch ``--deep`` is made from it. Each round resumes ``Trainer.fit`` from both
(interleaved) and times ``fit`` start to the first ``train_batch`` call, counting the records read
before it (only that batch's: skipping reads nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _mse_trial import MSETrial
from torch import nn

from determined_trials import pytorch
from determined_trials.loop import TRIAL_STATE_FILE

__all__ = ["main"]

BATCH, NEAR = 32, 10


class _Records(torch.utils.data.Dataset[Any]):
    """``n`` records made from their index; counts the reads."""

    def __init__(self, n: int) -> None:
        self.n, self.reads = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads += 1
        return torch.full((4,), float(i % 97) / 97), torch.tensor([float(i % 13) / 13])


def _trial_class(records: int) -> type:
    class _ResumeTrial(MSETrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            self.context = context
            self.model = context.wrap_model(nn.Linear(4, 1))
            self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))
            self.data = _Records(records)
            self.first_batch_at: float | None = None
            self.reads_before_first: int | None = None

        def build_training_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(self.data, batch_size=BATCH, shuffle=True)

        def build_validation_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(_Records(BATCH), batch_size=BATCH)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            if self.first_batch_at is None:
                self.first_batch_at, self.reads_before_first = time.perf_counter(), self.data.reads
            return super().train_batch(batch, epoch_idx, batch_idx)

    return _ResumeTrial


def _config(length: int) -> dict[str, Any]:
    return {"hyperparameters": {"global_batch_size": BATCH}, "reproducibility": {"experiment_seed": 7},
            "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": length}}}


def _fit(run_dir: Path, records: int, length: int, latest: str | None) -> tuple[Any, str]:
    with pytorch.init(exp_conf=_config(length), run_dir=str(run_dir), enable_tensorboard_logging=False) as context:
        trial = _trial_class(records)(context)
        start = time.perf_counter()
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(length), latest_checkpoint=latest,
                                            checkpoint_policy="none", show_progress=False)
        trial.first_batch_at -= start
        core = context._core
        assert core is not None
        uuid = core.store.checkpoints(trial_id=context.get_trial_id())[-1].uuid
        if latest is None:
            uuid = _deep_copy_of(core, uuid)
    return trial, uuid


def _deep_copy_of(core: Any, uuid: str) -> str:
    """Return ``uuid`` (batch NEAR) but first store the same state positioned at --deep (global _DEEP)."""
    with core.checkpoint.restore_path(uuid) as src:
        files = {p.name: p.read_bytes() for p in Path(src).iterdir() if p.name != "metadata.json"}
    state = json.loads(files[TRIAL_STATE_FILE])
    epoch_len = -(-_ARGS.records // BATCH)
    state.update(batches_trained=_ARGS.deep, last_checkpoint=_ARGS.deep, last_validation=_ARGS.deep,
                 epochs_trained=_ARGS.deep // epoch_len)
    files[TRIAL_STATE_FILE] = json.dumps(state).encode()
    metadata = {**core.checkpoint.get_metadata(uuid), "steps_completed": _ARGS.deep}
    with core.checkpoint.store_path(metadata) as (path, deep):
        for name, data in files.items():
            (path / name).write_bytes(data)
    _DEEP_ID.append(deep)
    return uuid


_ARGS = argparse.Namespace()
_DEEP_ID: list[str] = []


def main() -> None:
    """Make the two checkpoints, resume from each in interleaved rounds, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--deep", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds, 100k records, deep 1000")
    args = parser.parse_args(namespace=_ARGS)
    if args.quick:
        args.rounds, args.records, args.deep = 2, 100_000, 1000
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {"near": [], "deep": []}
    with tempfile.TemporaryDirectory(prefix="det-resume-bench-") as tmp:
        _, near = _fit(Path(tmp), args.records, NEAR, None)
        points = {"near": (near, NEAR), "deep": (_DEEP_ID[0], args.deep)}
        for rnd in range(args.rounds):
            for name in (("near", "deep") if rnd % 2 == 0 else ("deep", "near")):
                uuid, position = points[name]
                trial, _ = _fit(Path(tmp), args.records, position + 1, uuid)
                reads = trial.reads_before_first - BATCH  # the first batch's own records are read, nothing else
                assert reads == 0, f"{reads} records read to skip to batch {position}"
                times[name].append(trial.first_batch_at)
            print(f"round {rnd + 1}/{args.rounds}: first batch after resuming at batch {NEAR}: "
                  f"{times['near'][-1] * 1e3:.1f} ms, at batch {args.deep}: {times['deep'][-1] * 1e3:.1f} ms",
                  flush=True)
    ratio = statistics.median(d / n for d, n in zip(times["deep"], times["near"]))
    print(f"\nresume into {args.records} shuffled records, {args.rounds} rounds, medians: time to first batch at "
          f"batch {NEAR}: {statistics.median(times['near']) * 1e3:.1f} ms, at batch {args.deep}: "
          f"{statistics.median(times['deep']) * 1e3:.1f} ms (ratio {ratio:.2f}); records read to skip: 0")


if __name__ == "__main__":
    main()
