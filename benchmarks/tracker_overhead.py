"""Per-batch training time with an MLflow tracking server receiving the trial's run vs no tracker, in the same run.

Usage: python benchmarks/tracker_overhead.py [--rounds 7] [--batches 3000] [--report 10] [--period 500] [--width 64]
                                            [--self-check] [--quick]

A real ``mlflow server`` (SQLite backend in a temporary folder) is started on 127.0.0.1 once. Each round runs four
``Trainer.fit`` calls in this process: a small MSE trial (an MLP ``--width`` wide, 64 by default; batches of 32) for
``--batches`` batches, reporting training metrics every ``--report`` batches, validating and checkpointing every
``--period`` -- twice with ``integrations: {mlflow: {tracking_uri: <server>}}`` (the trial's tracker helper process
sends the rows to the server while training goes on) and twice without, in the order on-off-off-on, then off-on-on-off
in the next round. Two fits per arm in mirrored positions cancel both a drift over the round and a slower first (or
second) fit, which a plain on/off alternation over an odd number of rounds does not. Timed: ``fit`` from its first batch
to its end (per batch; the helper's start, which waits for its client to be built, comes before the first batch, as the
client's import did in the trial process before); the tracker's last flush when the context closes is printed apart, and
so is the CPU time used during the fits by the trial's own tracker thread (``trial_thread_cpu_share``: the thread that
stores the reports the trial holds, the only tracker work left in the training process) and by the helper process
(``helper_cpu_ms``: another process, which competes for the CPUs, not for the interpreter). Before each fit the garbage
of the earlier ones is collected, so that no gen-2 collection (~0.2 s here) lands inside one fit by chance. Printed: the
median of the per-round ratios (on + on) / (off + off).

``--self-check`` runs the same schedule with no tracker in either arm: its median is the benchmark's own bias and
noise, to be read next to the real figure (it should be 1.00 within the spread of the rounds).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from _mse_trial import MSETrial
from torch import nn

from determined_trials import pytorch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from helpers_trackers import mlflow_server  # noqa: E402

__all__ = ["main"]

BATCH = 32


class _Trial(MSETrial):
    def __init__(self, context: pytorch.PyTorchTrialContext, width: int) -> None:
        self.context = context
        torch.manual_seed(0)
        self.model = context.wrap_model(nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=1e-3))
        self.data = torch.utils.data.TensorDataset(torch.randn(2048, width), torch.randn(2048, width))
        self.first_batch_at: float | None = None

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
        if self.first_batch_at is None:
            self.first_batch_at = time.perf_counter()
        return super().train_batch(batch, epoch_idx, batch_idx)

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.data, batch_size=BATCH, shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        val = torch.utils.data.TensorDataset(self.data.tensors[0][:256], self.data.tensors[1][:256])
        return pytorch.DataLoader(val, batch_size=256)


def _trial_thread_cpu_s() -> float:
    """CPU seconds the trial's tracker thread (it stores held reports) has used so far (0 when there is none)."""
    for thread in threading.enumerate():
        if thread.name == "det-report-flush" and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


def _helper_cpu_s() -> float:
    """CPU seconds this process's tracker helper process has used so far (0 when there is none)."""
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or b"determined_trials.core.trackers" not in (proc / "cmdline").read_bytes():
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():  # ppid
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return 0.0


class _Fit(NamedTuple):
    """One timed fit."""

    per_batch_s: float  # wall seconds per batch in ``fit`` (from its first batch)
    close_s: float  # seconds the context's close took (the tracker's last flush)
    thread_cpu_s: float  # CPU seconds the trial's tracker thread used during ``fit``
    helper_cpu_s: float  # CPU seconds the helper process used from its start to the end of ``fit``


def _fit(args: argparse.Namespace, run_dir: Path, uri: str | None) -> _Fit:
    gc.collect()  # the previous fits' garbage: not collected (a gen-2 pass: ~0.2 s) inside this one's timing
    config: dict[str, Any] = {
        "name": "tracker-overhead", "hyperparameters": {"global_batch_size": BATCH},
        "reproducibility": {"experiment_seed": 1},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": args.batches}}}
    if uri is not None:
        config["integrations"] = {"mlflow": {"tracking_uri": uri}}
    with pytorch.init(exp_conf=config, run_dir=str(run_dir), enable_tensorboard_logging=False) as context:
        trial = _Trial(context, args.width)
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(args.batches), reporting_period=pytorch.Batch(args.report),
            validation_period=pytorch.Batch(args.period), checkpoint_period=pytorch.Batch(args.period),
            checkpoint_policy="none", show_progress=False)
        assert trial.first_batch_at is not None
        fit = time.perf_counter() - trial.first_batch_at
        thread_cpu, helper_cpu = _trial_thread_cpu_s(), _helper_cpu_s()
        closing = time.perf_counter()
    return _Fit(fit / (args.batches - 1), time.perf_counter() - closing, thread_cpu, helper_cpu)


def _round_order(rnd: int) -> tuple[str, ...]:
    """The four fits of a round: on-off-off-on, mirrored (off-on-on-off) in every other round."""
    return ("on", "off", "off", "on") if rnd % 2 else ("off", "on", "on", "off")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--report", type=int, default=10)
    parser.add_argument("--period", type=int, default=500)
    parser.add_argument("--width", type=int, default=64, help="the MLP's width (a larger one: a longer batch)")
    parser.add_argument("--self-check", action="store_true", help="no tracker in either arm (an A/A run)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 200 batches (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.batches, args.period = 2, 200, 100
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, mlflow_server(Path(tmp) / "mlflow") as uri:
        tracked = None if args.self_check else uri
        for rnd in range(args.rounds + 1):  # round 0 warms up (imports, the server's first requests)
            per: dict[str, list[_Fit]] = {"on": [], "off": []}
            for i, mode in enumerate(_round_order(rnd)):
                per[mode].append(_fit(args, Path(tmp) / f"run-{rnd}-{i}", tracked if mode == "on" else None))
            if rnd:
                on, off = (sum(fit.per_batch_s for fit in per[mode]) for mode in ("on", "off"))
                thread_cpu = sum(fit.thread_cpu_s for fit in per["on"])
                helper_cpu = sum(fit.helper_cpu_s for fit in per["on"])
                rows.append({"off_ms": off / 2 * 1e3, "on_ms": on / 2 * 1e3, "ratio": on / off,
                             "close_on_s": max(fit.close_s for fit in per["on"]),
                             "trial_thread_cpu_ms": thread_cpu / 2 * 1e3,
                             "trial_thread_cpu_share": thread_cpu / (on * args.batches),
                             "helper_cpu_ms": helper_cpu / 2 * 1e3})
                print(json.dumps({k: round(v, 4) for k, v in rows[-1].items()}), flush=True)
    result = {"rounds": args.rounds, "batches": args.batches, "report_every": args.report,
              "self_check": args.self_check, "ratio_spread": [round(min(r["ratio"] for r in rows), 4),
                                                             round(max(r["ratio"] for r in rows), 4)],
              "off_ms_per_batch": statistics.median(r["off_ms"] for r in rows),
              "on_ms_per_batch": statistics.median(r["on_ms"] for r in rows),
              "median_ratio": statistics.median(r["ratio"] for r in rows),
              "close_on_s": statistics.median(r["close_on_s"] for r in rows),
              "trial_thread_cpu_ms_per_fit": statistics.median(r["trial_thread_cpu_ms"] for r in rows),
              "trial_thread_cpu_share": statistics.median(r["trial_thread_cpu_share"] for r in rows),
              "helper_cpu_ms_per_fit": statistics.median(r["helper_cpu_ms"] for r in rows)}
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))
    return result


if __name__ == "__main__":
    main()
