"""FSDP2 under ``Trainer.fit`` on 2 processes: how long the loop is held per sharded (DCP) checkpoint written
in the background, against a synchronous ``dcp.save`` of the same state; and FSDP2's step time against
the same model under DDP.

Usage: python benchmarks/fsdp.py [--rounds 7] [--batches 40] [--period 10] [--width 768] [--depth 4]
                                 [--device cpu|cuda] [--quick]

Two rank processes (gloo on the CPU, nccl with ``--device cuda``) run the rounds. Each round, in an order
that alternates between rounds, fits (1) the FSDP2 model (``fully_shard`` per block and on the root,
AdamW) with a checkpoint every ``--period`` batches, timing the training thread in the loop's checkpoint
step and in collecting finished writes (the last checkpoint, written at once at the end of fit, is not
counted; metrics are reported twice per checkpoint period, and a finished write is collected at a report,
as in a run that reports more often than it checkpoints); (2) the FSDP2 model and (3) the same model
under DDP without checkpoints, timing the batches. The baseline, in the same round and processes:
``dcp.save`` of the FSDP2 model's and optimizer's sharded state, barrier to barrier. Times are rank 0's;
ratios are medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from _checkpoint_timer import CheckpointTimer
from _mse_trial import MSETrial
from torch import nn

from determined_trials import pytorch

__all__ = ["launch_ranks", "main"]

BATCH = 8  # records per rank


class _Trial(MSETrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hp = context.get_hparams()
        torch.manual_seed(0)
        width, depth = hp["width"], hp["depth"]
        model = nn.Sequential(*[nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, width))
                                for _ in range(depth)])
        if hp["fsdp"]:
            from torch.distributed.fsdp import fully_shard

            model = model.to(context.device)
            for block in model:
                fully_shard(block)
            fully_shard(model)
        self.model = context.wrap_model(model)
        self.optimizer = context.wrap_optimizer(torch.optim.AdamW(self.model.parameters(), lr=1e-4))
        gen = torch.Generator().manual_seed(1)
        self.data = torch.utils.data.TensorDataset(torch.randn(256, width, generator=gen),
                                                   torch.randn(256, width, generator=gen))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.data, batch_size=BATCH, shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        val = torch.utils.data.TensorDataset(self.data.tensors[0][:16], self.data.tensors[1][:16])
        return pytorch.DataLoader(val, batch_size=8)  # one batch a rank: a sharded forward needs both


def _fit(args: argparse.Namespace, run_dir: Path, *, fsdp: bool, period: int | None) -> tuple[float, float, Any]:
    """(loop held per checkpoint, seconds per batch, trial)."""
    hparams = {"global_batch_size": 2 * BATCH, "width": args.width, "depth": args.depth, "fsdp": fsdp}
    config = {"hyperparameters": hparams, "reproducibility": {"experiment_seed": 1},
              "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": args.batches}}}
    with pytorch.init(exp_conf=config, run_dir=str(run_dir), enable_tensorboard_logging=False) as context:
        trial = _Trial(context)
        with CheckpointTimer() as timer:
            start = time.perf_counter()
            pytorch.Trainer(trial, context).fit(
                max_length=pytorch.Batch(args.batches), checkpoint_period=pytorch.Batch(period or 10**9),
                reporting_period=pytorch.Batch(max(1, args.period // 2)), checkpoint_policy="none",
                show_progress=False)
            total = time.perf_counter() - start
    return timer.per_checkpoint, total / args.batches, trial


def _sync_dcp_save(trial: Any, folder: Path) -> float:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(trial.model, trial.optimizer)
    dist.barrier()
    start = time.perf_counter()
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
    dist.barrier()
    return time.perf_counter() - start


def _rank_main(args: argparse.Namespace) -> None:
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    keys = ("held", "sync", "held_ratio", "fsdp_step", "ddp_step", "step_ratio")
    rows: dict[str, list[float]] = {k: [] for k in keys}
    with tempfile.TemporaryDirectory(prefix=f"det-fsdp-bench-{rank}-") as tmp:
        shared = Path(args.out).parent / "runs"
        for rnd in range(args.rounds):
            run_dir = shared / f"round-{rnd}"
            held, trial = 0.0, None
            step: dict[bool, float] = {}
            for kind in (("ckpt", "fsdp", "ddp") if rnd % 2 == 0 else ("ddp", "fsdp", "ckpt")):
                if kind == "ckpt":
                    held, _, trial = _fit(args, run_dir, fsdp=True, period=args.period)
                else:
                    _, step[kind == "fsdp"], _ = _fit(args, run_dir, fsdp=kind == "fsdp", period=None)
            sync = _sync_dcp_save(trial, Path(tmp, f"sync-{rnd}"))
            for key, value in (("held", held), ("sync", sync), ("held_ratio", held / sync), ("fsdp_step", step[True]),
                               ("ddp_step", step[False]), ("step_ratio", step[True] / step[False])):
                rows[key].append(value)
            if rank == 0:
                print(f"round {rnd + 1}/{args.rounds}: loop held per checkpoint {held * 1e3:.1f} ms, synchronous "
                      f"dcp.save {sync * 1e3:.1f} ms; step FSDP2 {step[True] * 1e3:.1f} ms, DDP "
                      f"{step[False] * 1e3:.1f} ms", flush=True)
    if rank == 0:
        params = args.depth * 2 * (2 * args.width * args.width + args.width) + args.depth * args.width
        Path(args.out).write_text(json.dumps({"rows": rows, "params": params}))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch_ranks(script: Path, argv: list[str], timeout: float, device: str) -> Any:
    """Run ``script argv --out FILE`` as 2 gloo/nccl rank processes on 127.0.0.1 (with a timeout); rank 0's
    ``FILE`` (JSON), read back. Shared with benchmarks/hsdp.py."""
    with tempfile.TemporaryDirectory(prefix="det-fsdp-bench-") as tmp:
        out = Path(tmp, "result.json")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   GROUP_RANK="0", GROUP_WORLD_SIZE="1", DET_JOB_ID=uuid.uuid4().hex, OMP_NUM_THREADS="1")
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        command = [sys.executable, str(script.resolve()), *argv, "--out", str(out)]
        procs = [subprocess.Popen(command, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(2)]
        try:
            deadline = time.monotonic() + timeout
            for proc in procs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if any(proc.returncode != 0 for proc in procs):
            raise SystemExit(f"a rank failed: exit codes {[p.returncode for p in procs]}")
        return json.loads(out.read_text())


def main() -> None:
    """Start the 2 ranks, wait (with a timeout), print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--period", type=int, default=10)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 8 batches of a small model")
    parser.add_argument("--out", help=argparse.SUPPRESS)  # set for the rank processes
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.batches, args.period, args.width, args.depth = 2, 8, 4, 64, 2
    if args.out:
        _rank_main(args)
        return
    result = launch_ranks(Path(__file__), sys.argv[1:], args.timeout, args.device)
    med = {k: statistics.median(v) for k, v in result["rows"].items()}
    print(f"\n{result['params'] / 1e6:.1f}M parameters (AdamW: twice as much state), 2 processes on {args.device}, "
          f"checkpoint every {args.period} of {args.batches} batches, {args.rounds} rounds, medians:")
    print(f"loop held per sharded checkpoint {med['held'] * 1e3:.1f} ms; synchronous dcp.save "
          f"{med['sync'] * 1e3:.1f} ms")
    print(f"held / synchronous dcp.save (median of per-round ratios): {med['held_ratio']:.3f}")
    print(f"step time FSDP2 {med['fsdp_step'] * 1e3:.1f} ms, DDP {med['ddp_step'] * 1e3:.1f} ms; FSDP2 / DDP "
          f"(median of per-round ratios): {med['step_ratio']:.3f}")


if __name__ == "__main__":
    main()
