"""One try of ``largest_model.py``: a stack of residual MLP blocks of a given depth, trained a few steps
by a DeepSpeedTrial through ``Trainer.fit`` in this process; prints one JSON line (``ok`` with samples/s,
or ``oom``) and leaves.

Usage (``largest_model.py`` starts it; one process per try, so an out-of-memory never poisons the next):
    python benchmarks/_large_trial.py --zero 2|3 [--offload] --depth N --width W --seq S --steps K --warmup J
        [--smoke] [--fake-oom-above PARAMS] [--optimizer torch|cpu_adam]

The model is a transformer's feed-forward half: ``depth`` pre-LayerNorm blocks ``x + W2 gelu(W1 ln(x))``
(``W1``: width -> 4 width), ``8 width**2 + 7 width`` parameters each. A sample is one sequence of ``seq``
tokens (a ``(seq, width)`` tensor), one per step. ZeRO-2 builds the model in place on the device (bf16);
ZeRO-3 builds it inside ``context.zero_init`` (partitioned, on the host with ``--offload``). The step is
timed from the start of step ``warmup`` to the end of the last step (device synchronised at both ends).
After the last step the process prints its line and exits at once (``os._exit``): the run's final
checkpoint (16 bytes a parameter, larger than the device machine's disk for the largest models) is not
what this measures. ``--smoke``: CPU, fp32, gloo; ``--fake-oom-above`` raises ``torch.OutOfMemoryError``
for a model of more parameters, as CUDA would, to exercise the search on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("DET_DEEPSPEED_SHM_COMM", "0")

import torch  # noqa: E402
from torch import nn  # noqa: E402

__all__ = ["block_params", "main"]

MARK = "largest_model_try"


def block_params(width: int) -> int:
    """Parameters of one block: LayerNorm (2w), w -> 4w (4w^2 + 4w), 4w -> w (4w^2 + w)."""
    return 8 * width * width + 7 * width


class _Block(nn.Module):
    def __init__(self, width: int, **factory: Any) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width, **factory)
        self.up = nn.Linear(width, 4 * width, **factory)
        self.down = nn.Linear(4 * width, width, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class _Sequences(torch.utils.data.Dataset[torch.Tensor]):
    """``length`` sequences drawn from a pool of two random ones (no host memory per sample)."""

    def __init__(self, length: int, seq: int, width: int) -> None:
        self._pool = torch.randn(2, seq, width, generator=torch.Generator().manual_seed(0))
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: int) -> torch.Tensor:
        return self._pool[i % 2]


def _ds_config(args: argparse.Namespace) -> dict[str, Any]:
    # torch's fused AdamW: one kernel over each tensor, no foreach temporaries (ZeRO-2's peak memory)
    adam: dict[str, Any] = {"lr": 1e-5}
    if args.optimizer == "torch":
        adam.update(torch_adam=True, fused=True)
    zero: dict[str, Any] = {"stage": args.zero}
    if args.offload:
        pin = not args.smoke
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
        if args.zero == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    return {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "Adam", "params": adam}, "zero_optimization": zero,
            "bf16": {"enabled": not args.smoke}, "steps_per_print": 10**9}


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _emit(args: argparse.Namespace, status: str, **fields: Any) -> None:
    line = {MARK: True, "zero": args.zero, "offload": args.offload, "depth": args.depth, "width": args.width,
            "params": args.depth * block_params(args.width), "status": status, **fields}
    if torch.cuda.is_available():
        line["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(json.dumps(line), flush=True)


def _trial_class(args: argparse.Namespace) -> type:
    import deepspeed

    from determined_trials import deepspeed as det_ds
    from determined_trials import pytorch

    dtype = torch.float32 if args.smoke else torch.bfloat16

    class LargeTrial(det_ds.DeepSpeedTrial):
        def __init__(self, context: det_ds.DeepSpeedTrialContext) -> None:
            self.context = context
            config = _ds_config(args)
            if args.zero == 3:
                with context.zero_init(config):
                    model = nn.Sequential(*(_Block(args.width) for _ in range(args.depth)))
            else:
                with torch.device(context.device):
                    model = nn.Sequential(*(_Block(args.width, dtype=dtype) for _ in range(args.depth)))
            params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
            if args.fake_oom_above and params > args.fake_oom_above:
                raise torch.OutOfMemoryError(f"fake: {params} parameters > --fake-oom-above {args.fake_oom_above}")
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
            self.engine = context.wrap_model_engine(engine)
            self.t0 = 0.0

        def build_training_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(_Sequences(args.steps, args.seq, args.width), batch_size=1)

        def build_validation_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(_Sequences(1, args.seq, args.width), batch_size=1)

        def train_batch(self, dataloader_iter: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            x = next(dataloader_iter).to(self.engine.device, dtype, non_blocking=True)
            if batch_idx == args.warmup:
                _synchronize()
                self.t0 = time.perf_counter()
            loss = self.engine(x).float().pow(2).mean()
            self.engine.backward(loss)
            self.engine.step()
            if batch_idx == args.steps - 1:
                _synchronize()
                rate = (args.steps - args.warmup) / (time.perf_counter() - self.t0)
                _emit(args, "ok", samples_per_s=round(rate, 3), tokens_per_s=round(rate * args.seq, 1),
                      loss=float(loss.detach()), steps=args.steps, measured_steps=args.steps - args.warmup,
                      optimizer=type(self.engine.basic_optimizer).__name__,
                      fused=self.engine.basic_optimizer.defaults.get("fused"))
                os._exit(0)  # before the run's final checkpoint (see the module docstring)
            return loss

        def evaluate_batch(self, dataloader_iter: Any, batch_idx: int) -> dict[str, torch.Tensor]:
            return {"validation_loss": self.engine(next(dataloader_iter).to(self.engine.device, dtype)).float().mean()}

    return LargeTrial


def _is_oom(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, says the device ran out of memory."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, torch.OutOfMemoryError) or "out of memory" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zero", type=int, choices=(2, 3), required=True)
    parser.add_argument("--offload", action="store_true")
    parser.add_argument("--depth", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--optimizer", choices=("torch", "cpu_adam"), default="torch")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--fake-oom-above", type=int, default=0)
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be below --steps")
    return args


def _die_with_parent() -> None:
    """Killed when ``largest_model.py`` ends, however it ends (a device command cut short must not leave a
    try holding the GPU): Linux's parent-death signal, then a check that the parent did not already go."""
    if sys.platform != "linux":
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(os.environ.get("DET_LARGEST_PARENT", os.getppid())):
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    _die_with_parent()
    import logging

    from determined_trials import deepspeed as det_ds

    logging.getLogger("determined_trials").setLevel(logging.WARNING)
    config = {"hyperparameters": {"global_batch_size": 1},
              "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": args.steps}}}
    try:
        with tempfile.TemporaryDirectory(prefix="det-largest-") as tmp, \
                det_ds.init(exp_conf=config, run_dir=tmp) as context:
            trial = _trial_class(args)(context)
            det_ds.Trainer(trial, context).fit(max_length=det_ds.Batch(args.steps), checkpoint_policy="none",
                                               show_progress=False)
    except BaseException as exc:  # noqa: BLE001  (an OOM is a result; anything else is reported as an error)
        _emit(args, "oom" if _is_oom(exc) else "error", message=f"{type(exc).__name__}: {str(exc)[:500]}")
        sys.stdout.flush()
        os._exit(0 if _is_oom(exc) else 1)  # no teardown of a process group in a broken state
    _emit(args, "error", message="fit returned before the last step was measured")
    return 1


if __name__ == "__main__":
    sys.exit(main())
