"""Training-time overhead of ``Trainer.fit`` over a plain PyTorch loop doing the same work.

Usage: python benchmarks/overhead.py [--rounds 7] [--batches 2000] [--period 500] [--variant] [--quick]
                                    [--device cuda] [--shape gpu-bound]

Four modes, each measured in a fresh process (this script re-run with ``--child MODE``), rounds
interleaved (the order rotates every round):

- ``raw``        a hand-written loop: torch DataLoader over a TensorDataset (batch 32, shuffle),
                 SGD on a 64->64->10 MLP, the loss kept on the device and averaged once every
                 ``--report`` batches (one host sync), a validation pass every ``--period`` batches;
- ``raw-ckpt``   the same plus ``torch.save`` of the model and optimizer state every ``--period``;
- ``trial``      the same model as a PyTorchTrial run by ``Trainer.fit(max_length=Batch(batches),
                 validation_period=Batch(period), reporting_period=Batch(report),
                 checkpoint_policy="none")``;
- ``trial-ckpt`` the same with ``checkpoint_period=Batch(period)``.

What is timed: ``time.perf_counter()`` around the training call only, i.e. around the whole raw loop
(building its DataLoader included) and around ``Trainer(trial, context).fit(...)``. Process start-up,
imports, data generation, model construction and ``det.pytorch.init()`` are outside the timing, in
both. Every child runs with ``torch.set_num_threads(1)`` (and OMP/MKL_NUM_THREADS=1) for stability.
``--variant`` (the shape of an outside benchmark): SGD with momentum 0.9, shuffling with a seeded
``torch.Generator`` in both loops, and ``Trainer.fit`` at its default reporting period (no
``reporting_period`` argument; the raw loop still averages every 100 batches).
``--device cuda``: both loops train on the GPU with the data already there (both datasets are CUDA
tensors before the timing starts) and the timing ends after ``torch.cuda.synchronize()``; on the
default ``cpu`` the children see no GPU. ``--shape gpu-bound``: a 2048->8192->10 MLP on batches of
2048 (16,384 training rows; ~200 GFLOP a step in float32, milliseconds on a current GPU), instead
of the launch-bound 64->64->10 on batches of 32.
Note that ``Trainer.fit`` always ends with a checkpoint (as Determined does), so the ``trial``
mode writes one checkpoint that ``raw`` does not: it is counted as harness overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["MODES", "add_shape_arguments", "check_at_least_one", "child_env", "main", "shape_argv"]

Region = Callable[[Callable[[], Any]], Any]  # runs the measured part (instructions.py wraps it)


def _plain(measured: Callable[[], Any]) -> Any:
    return measured()

MODES = ("raw", "trial", "raw-ckpt", "trial-ckpt")
SEED = 1234
N_VAL, CLASSES, VAL_BATCH, LR = 512, 10, 256, 0.05
SHAPES = {  # name -> (training rows, features, hidden units, batch size)
    "launch-bound": (2048, 64, 64, 32),
    "gpu-bound": (16384, 2048, 8192, 2048),
}


def _shape(args: argparse.Namespace) -> tuple[int, int, int, int]:
    return SHAPES[args.shape]


def _synchronize(args: argparse.Namespace) -> None:
    """Wait for the GPU's queued work, so the timing covers it (nothing to wait for on the CPU)."""
    if args.device == "cuda":
        import torch

        torch.cuda.synchronize()


# -- shared set-up (children only) -------------------------------------------------------------


def _datasets(args: argparse.Namespace) -> tuple[Any, Any]:
    """Synthetic, learnable 'digits-like' data: the shape's features, 10 classes, a fixed seed; on
    ``--device`` already."""
    import torch
    from torch.utils.data import TensorDataset

    n_train, features, _, _ = _shape(args)
    gen = torch.Generator().manual_seed(SEED)
    weights = torch.randn(features, CLASSES, generator=gen)
    x = torch.randn(n_train + N_VAL, features, generator=gen)
    y = (x @ weights + 0.5 * torch.randn(n_train + N_VAL, CLASSES, generator=gen)).argmax(dim=1)
    x, y = x.to(args.device), y.to(args.device)
    return TensorDataset(x[:n_train], y[:n_train]), TensorDataset(x[n_train:], y[n_train:])


def _mlp(args: argparse.Namespace) -> Any:
    from torch import nn

    _, features, hidden, _ = _shape(args)
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES)).to(args.device)


# -- the raw loop ------------------------------------------------------------------------------


def _raw_validate(model: Any, loader: Any, device: str) -> float:
    import torch
    from torch import nn

    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # where the batches' losses are
    correct = torch.zeros((), dtype=torch.float64, device=device)
    with torch.no_grad():
        for x, y in loader:
            logits = model(x)
            loss_sum += nn.functional.cross_entropy(logits, y) * len(y)
            correct += (logits.argmax(dim=1) == y).float().mean() * len(y)
    model.train()
    _ = (loss_sum / len(loader.dataset)).item()
    return (correct / len(loader.dataset)).item()


def _raw_loop(args: argparse.Namespace, ckpt: bool, out_dir: Path, region: Region = _plain) -> dict[str, Any]:
    import torch

    torch.manual_seed(SEED)
    train_data, val_data = _datasets(args)
    model = _mlp(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=_momentum(args))
    start, cpu_start = time.perf_counter(), time.process_time()
    reported, accuracy = region(lambda: _raw_train(args, ckpt, out_dir, train_data, val_data, model, optimizer))
    _synchronize(args)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"seconds": seconds, "cpu_seconds": cpu, "loss": round(reported, 4), "val_accuracy": round(accuracy, 4)}


def _raw_train(args: argparse.Namespace, ckpt: bool, out_dir: Path, train_data: Any, val_data: Any, model: Any,
               optimizer: Any) -> tuple[float, float]:
    """The timed part of the raw loop: (last reported loss, last validation accuracy)."""
    import torch
    from torch import nn

    batch_size = _shape(args)[3]
    loader = torch.utils.data.DataLoader(train_data, batch_size=batch_size, shuffle=True, generator=_generator(args))
    val_loader = torch.utils.data.DataLoader(val_data, batch_size=VAL_BATCH)
    losses: list[torch.Tensor] = []
    batches, accuracy, reported = 0, 0.0, 0.0
    while batches < args.batches:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
            batches += 1
            if batches % args.report == 0 or batches == args.batches:
                reported = torch.stack(losses).mean().item()
                losses = []
            if batches % args.period == 0 or batches == args.batches:
                accuracy = _raw_validate(model, val_loader, args.device)
            if ckpt and batches % args.period == 0:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save(state, out_dir / f"ckpt-{batches}.pth")
            if batches == args.batches:
                break
    return reported, accuracy


# -- the trial ---------------------------------------------------------------------------------


def _momentum(args: argparse.Namespace) -> float:
    return 0.9 if args.variant else 0.0


def _generator(args: argparse.Namespace) -> Any:
    import torch

    return torch.Generator().manual_seed(SEED) if args.variant else None


def _trial_class(args: argparse.Namespace) -> type:
    import torch
    from torch import nn

    from determined_trials import pytorch

    class MLPTrial(pytorch.PyTorchTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            self.context = context
            torch.manual_seed(SEED)
            self.train_data, self.val_data = _datasets(args)
            self.model = context.wrap_model(_mlp(args))
            sgd = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=_momentum(args))
            self.optimizer = context.wrap_optimizer(sgd)

        def build_training_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(self.train_data, batch_size=_shape(args)[3], shuffle=True,
                                      generator=_generator(args))

        def build_validation_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(self.val_data, batch_size=VAL_BATCH)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.cross_entropy(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.optimizer)
            return loss

        def evaluate_batch(self, batch: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]  # both forms allowed
            x, y = batch
            logits = self.model(x)
            return {"validation_loss": nn.functional.cross_entropy(logits, y),
                    "validation_accuracy": (logits.argmax(dim=1) == y).float().mean()}

    return MLPTrial


def _trial_fit(args: argparse.Namespace, ckpt: bool, run_dir: Path, region: Region = _plain) -> dict[str, Any]:
    from determined_trials import pytorch

    config = {
        "name": "overhead-benchmark",
        "hyperparameters": {"global_batch_size": _shape(args)[3]},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": args.batches}},
        "reproducibility": {"experiment_seed": SEED},
    }
    seen: dict[str, Any] = {}
    with pytorch.init(exp_conf=config, run_dir=str(run_dir)) as context:
        trial = _trial_class(args)(context)
        trainer = pytorch.Trainer(trial, context)
        # settle the trial and build its parts (its train context, TensorBoard writer, trackers): init()'s work
        # until the trial's identity was settled lazily, kept outside the timing as before
        _ = context._core.train
        reporting: dict[str, Any] = {} if args.variant else {"reporting_period": pytorch.Batch(args.report)}
        start, cpu_start = time.perf_counter(), time.process_time()
        region(lambda: trainer.fit(
            max_length=pytorch.Batch(args.batches),
            validation_period=pytorch.Batch(args.period),
            checkpoint_period=pytorch.Batch(args.period) if ckpt else None,
            checkpoint_policy="none",
            show_progress=False,
            **reporting,
        ))
        _synchronize(args)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        store = context._core.store if context._core is not None else None
        if store is not None:
            seen["checkpoints"] = len(store.checkpoints())
            training = store.metrics(context.get_trial_id(), group="training")[-1].metrics
            validation = store.metrics(context.get_trial_id(), group="validation")[-1].metrics
            seen["loss"] = round(training["loss"], 4)
            seen["val_accuracy"] = round(validation["validation_accuracy"], 4)
    return {"seconds": seconds, "cpu_seconds": cpu, **seen}


def _child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="det-overhead-"))
    try:
        if args.child.startswith("raw"):
            result = _raw_loop(args, args.child == "raw-ckpt", work)
        else:
            result = _trial_fit(args, args.child == "trial-ckpt", work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"mode": args.child, **result}))


# -- the parent --------------------------------------------------------------------------------


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The loop's shape: --batches, --period, --report, --variant (instructions.py takes them too)."""
    parser.add_argument("--batches", type=int, default=2000, help="training batches (default 2000)")
    parser.add_argument("--period", type=int, default=500, help="validation/checkpoint period in batches")
    parser.add_argument("--report", type=int, default=100, help="training-metric reporting period in batches")
    parser.add_argument("--variant", action="store_true", help="momentum, a torch.Generator, default reporting")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both loops train")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="launch-bound", help="the model and batch size")


def check_at_least_one(parser: argparse.ArgumentParser, args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """Exit with a usage error naming the first of ``names`` below 1."""
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")


def shape_argv(args: argparse.Namespace) -> list[str]:
    """``add_shape_arguments``' values as a child's command-line arguments."""
    return ["--batches", str(args.batches), "--period", str(args.period), "--report", str(args.report),
            "--device", args.device, "--shape", args.shape] + (["--variant"] if args.variant else [])


def child_env(device: str = "cpu") -> dict[str, str]:
    """A child's environment: one thread for torch's kernels (stable timings and counts); on the CPU no
    GPU is visible (the trial's context would pick one)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _run_child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, *shape_argv(args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(args.device), timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"child {mode} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


_WIDTHS = (12, 10, 9, 9, 10, 8, 9, 11)
Samples = dict[str, dict[str, list[float]]]  # mode -> {"seconds": [...], "cpu_seconds": [...]}


def _measure(args: argparse.Namespace) -> Samples:
    samples: Samples = {mode: {"seconds": [], "cpu_seconds": []} for mode in MODES}
    for rnd in range(args.rounds):
        order = MODES[rnd % len(MODES):] + MODES[:rnd % len(MODES)]
        for mode in order:
            result = _run_child(mode, args)
            for key in ("seconds", "cpu_seconds"):
                samples[mode][key].append(result[key])
            extra = "".join(f" {k}={v}" for k, v in result.items() if k not in ("mode", "seconds", "cpu_seconds"))
            print(f"round {rnd + 1}/{args.rounds} {mode:<10} wall {result['seconds']:.3f} s, "
                  f"cpu {result['cpu_seconds']:.3f} s;{extra}", flush=True)
    return samples


def _report(samples: Samples, args: argparse.Namespace) -> None:
    wall = {mode: statistics.median(s["seconds"]) for mode, s in samples.items()}
    cpu = {mode: statistics.median(s["cpu_seconds"]) for mode, s in samples.items()}
    _, features, hidden, batch_size = _shape(args)
    print(f"\n{args.device}, {args.shape} ({features}->{hidden}->{CLASSES} MLP): {args.batches} batches of "
          f"{batch_size}, validation every {args.period}, reporting every {args.report}, "
          f"{args.rounds} rounds, torch.set_num_threads(1); training time (wall; process CPU as a cross-check):")
    header = ("mode", "median s", "min s", "max s", "us/batch", "ratio", "cpu s", "cpu ratio")
    print("".join(f"{h:<12}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(header, _WIDTHS))))
    for mode in MODES:
        base = "raw-ckpt" if mode.endswith("ckpt") else "raw"
        times = samples[mode]["seconds"]
        print(f"{mode:<12}{wall[mode]:>10.3f}{min(times):>9.3f}{max(times):>9.3f}"
              f"{wall[mode] / args.batches * 1e6:>10.1f}{wall[mode] / wall[base]:>7.3f}x"
              f"{cpu[mode]:>9.3f}{cpu[mode] / cpu[base]:>10.3f}x")
    for trial, raw in (("trial", "raw"), ("trial-ckpt", "raw-ckpt")):
        t, r = samples[trial]["seconds"], samples[raw]["seconds"]
        paired = statistics.median(a / b for a, b in zip(t, r))
        print(f"{trial} / {raw}: ratio of medians {wall[trial] / wall[raw]:.3f}x, median of per-round ratios "
              f"{paired:.3f}x, ratio of minima {min(t) / min(r):.3f}x")
    no_ckpt = wall["trial"] / wall["raw"]
    ckpt = wall["trial-ckpt"] / wall["raw-ckpt"]
    print(f"overhead ratio (no ckpt): {no_ckpt:.2f}x, (ckpt every {args.period}): {ckpt:.2f}x")


def main() -> None:
    """Parse the arguments; run one child measurement or the whole interleaved benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="measurements per mode (default 7)")
    add_shape_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 batches, period 50, 2 rounds")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed per child")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.batches, args.period, args.report, args.rounds = 200, 50, 50, 2
    check_at_least_one(parser, args, ("rounds", "batches", "period", "report"))
    if args.child:
        _child(args)
        return
    _report(_measure(args), args)


if __name__ == "__main__":
    main()
