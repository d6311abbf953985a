"""Per-batch training time with an MLflow tracking server receiving the trial's run vs no tracker, in the same run.

Usage: python benchmarks/tracker_overhead.py [--rounds 7] [--batches 3000] [--report 10] [--period 500] [--quick]

A real ``mlflow server`` (SQLite backend in a temporary folder) is started on 127.0.0.1 once. Each round runs two
``Trainer.fit`` calls in this process, their order alternating: a small MSE trial (64 -> 64 -> 64 MLP, batches of
32) for ``--batches`` batches, reporting training metrics every ``--report`` batches, validating and checkpointing
every ``--period`` -- once with ``integrations: {mlflow: {tracking_uri: <server>}}`` (the forwarder thread sends
the rows to the server while training goes on) and once without. Timed: ``fit`` only (per batch); the tracker's
last flush when the context closes is printed apart. Printed: the median of the per-round ratios on / off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _mse_trial import MSETrial
from torch import nn

from determined_trials import pytorch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from helpers_trackers import mlflow_server  # noqa: E402

__all__ = ["main"]

WIDTH, BATCH = 64, 32


class _Trial(MSETrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        torch.manual_seed(0)
        self.model = context.wrap_model(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH)))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=1e-3))
        self.data = torch.utils.data.TensorDataset(torch.randn(2048, WIDTH), torch.randn(2048, WIDTH))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.data, batch_size=BATCH, shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        val = torch.utils.data.TensorDataset(self.data.tensors[0][:256], self.data.tensors[1][:256])
        return pytorch.DataLoader(val, batch_size=256)


def _fit(args: argparse.Namespace, run_dir: Path, uri: str | None) -> tuple[float, float]:
    """(seconds per batch in fit, seconds the context's close took)."""
    config: dict[str, Any] = {
        "name": "tracker-overhead", "hyperparameters": {"global_batch_size": BATCH},
        "reproducibility": {"experiment_seed": 1},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": args.batches}}}
    if uri is not None:
        config["integrations"] = {"mlflow": {"tracking_uri": uri}}
    with pytorch.init(exp_conf=config, run_dir=str(run_dir), enable_tensorboard_logging=False) as context:
        trial = _Trial(context)
        start = time.perf_counter()
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(args.batches), reporting_period=pytorch.Batch(args.report),
            validation_period=pytorch.Batch(args.period), checkpoint_period=pytorch.Batch(args.period),
            checkpoint_policy="none", show_progress=False)
        fit = time.perf_counter() - start
        closing = time.perf_counter()
    return fit / args.batches, time.perf_counter() - closing


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--report", type=int, default=10)
    parser.add_argument("--period", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 300 batches (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.batches, args.period = 3, 300, 100
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, mlflow_server(Path(tmp) / "mlflow") as uri:
        for rnd in range(args.rounds + 1):  # round 0 warms up (imports, the server's first requests)
            per: dict[str, tuple[float, float]] = {}
            for mode in (("on", "off") if rnd % 2 else ("off", "on")):
                per[mode] = _fit(args, Path(tmp) / f"run-{rnd}-{mode}", uri if mode == "on" else None)
            if rnd:
                rows.append({"off_ms": per["off"][0] * 1e3, "on_ms": per["on"][0] * 1e3,
                             "ratio": per["on"][0] / per["off"][0], "close_on_s": per["on"][1]})
                print(json.dumps({k: round(v, 4) for k, v in rows[-1].items()}), flush=True)
    result = {"rounds": args.rounds, "batches": args.batches, "report_every": args.report,
              "off_ms_per_batch": statistics.median(r["off_ms"] for r in rows),
              "on_ms_per_batch": statistics.median(r["on_ms"] for r in rows),
              "median_ratio": statistics.median(r["ratio"] for r in rows),
              "close_on_s": statistics.median(r["close_on_s"] for r in rows)}
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))
    return result


if __name__ == "__main__":
    main()
