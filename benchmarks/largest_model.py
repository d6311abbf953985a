"""The largest model (parameters) one GPU trains with ZeRO-2, and with ZeRO-3 + CPU offload of parameters
and optimizer state, each with its samples (and tokens) per second; the goal is >= 3x the parameters.

Usage:
    python benchmarks/largest_model.py                   both searches, then the ratio (4-5 min on an H100)
    python benchmarks/largest_model.py --zero 2          one search (or --zero 3 --offload)
    python benchmarks/largest_model.py --smoke           the same on the CPU with tiny sizes (a test of the plumbing)

Method. The model is ``_large_trial.py``'s stack of residual MLP blocks of width ``--width`` (4096:
134M parameters a block); its depth is the one knob. Each try trains a fresh DeepSpeedTrial through
``Trainer.fit`` in a process of its own (``--steps`` steps of one sequence of ``--seq`` tokens, bf16 on
CUDA, torch's fused AdamW), so a CUDA out-of-memory never poisons the next try, and is killed after
``--try-timeout`` s. The search starts from 80 % of an estimate of the limit (ZeRO-2: 20 bytes a
parameter of GPU memory; offload: the cap below), doubles the depth while tries succeed, halves it while
they fail, then bisects between the largest depth that trained and the smallest that did not, until they
are within ``--tolerance`` (10 %) of each other or the config's ``--budget`` seconds are spent.

With offload, the host holds each parameter's fp32 master copy, Adam moments and fp32 gradient and its
bf16 copy (18 bytes); a depth whose estimate exceeds 85 % of the host's available memory, less 8 GiB, is
not tried (a host out-of-memory would kill the try, or worse): that depth is the search's cap, printed.
A try dies with this process (Linux's parent-death signal): a device command cut short leaves no try
holding the GPU. Every try prints one JSON line as it ends, so a run cut short keeps what finished; the
last lines are the summary (JSON, then one line of text). ``--smoke``: CPU accelerator, gloo, fp32,
width 16, depths up to ``--max-depth`` 4, and a fake memory limit (``--fake-oom-above``, 3 blocks'
parameters) above which a try raises ``torch.OutOfMemoryError`` as CUDA would.

Sizing (for one device command of ``gpu_check.sh large``): ``--budget`` 100 s of tries for ZeRO-2 and
150 s for offload (an offloaded 5B-parameter try is estimated at about a minute: pinning the host
buffers, the host Adam steps), so both searches take about 4-5 min with the start-up; no try starts
with under ``--min-try`` s left, and one cut by the budget gives no verdict. 4 steps, 1 of them
warm-up, with 10 % precision, is 4-6 tries a config.

Every run steps torch's fused AdamW (``torch_adam`` and ``fused`` in the optimizer's params: no foreach
temporaries), with offload on the host's fp32 partitions, not DeepSpeed's CPU Adam: that op would be
JIT-compiled on the GPU machine (ninja, a compiler, Python headers; ~1 min), and the host memory a
parameter takes is the same, so the largest size is the same and the samples/s a lower bound.
``--optimizer cpu_adam`` uses CPU Adam where its op is built.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _large_trial import MARK, block_params  # noqa: E402

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
GIB = 2**30
ZERO2_BYTES, OFFLOAD_HOST_BYTES = 20, 18  # per parameter (the estimates the search starts from)
HOST_SHARE, HOST_RESERVE = 0.85, 8 * GIB
BUDGET_S = {False: 100.0, True: 150.0}  # seconds of tries: ZeRO-2, offload (whose tries are the slow ones)


def search(probe: Callable[[int], bool | None], start: int, cap: int, tolerance: float) -> tuple[int, int]:
    """The largest size in ``1..cap`` for which ``probe`` says True: from ``start``, double while True and
    halve while False, then bisect until the gap is at most ``max(1, tolerance * largest)``. ``probe``
    returns None to end the search (time is up). Returns (largest that passed or 0, smallest that
    failed or ``cap + 1``)."""
    lo, hi = 0, cap + 1
    size: int | None = max(1, min(start, cap))
    while size is not None:
        verdict = probe(size)
        if verdict is None:
            break
        lo, hi = (size, hi) if verdict else (lo, size)
        size = _next_size(lo, hi, cap, tolerance)
    return lo, hi


def _next_size(lo: int, hi: int, cap: int, tolerance: float) -> int | None:
    if hi > cap:  # nothing failed yet: grow (capped)
        return min(2 * lo, cap) if lo < cap else None
    if lo == 0:  # nothing passed yet: shrink
        return hi // 2 if hi > 1 else None
    if hi - lo <= max(1, int(tolerance * lo)):
        return None
    return (lo + hi) // 2


def _child_env(smoke: bool) -> dict[str, str]:
    env = dict(os.environ, DET_DEEPSPEED_SHM_COMM="0", PYTHONUNBUFFERED="1", DET_LARGEST_PARENT=str(os.getpid()))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH", "")) if p)
    if smoke:
        env.update(CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    return env


def _run_try(args: argparse.Namespace, zero: int, offload: bool, depth: int, timeout: float) -> dict[str, Any]:
    """One try in a process group of its own: its JSON line, or a line saying how it ended."""
    cmd = [sys.executable, str(HERE / "_large_trial.py"), "--zero", str(zero), "--depth", str(depth),
           "--width", str(args.width), "--seq", str(args.seq), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--optimizer", args.optimizer]
    cmd += ["--offload"] * offload + ["--smoke"] * args.smoke
    cmd += ["--fake-oom-above", str(args.fake_oom_above)] if args.fake_oom_above else []
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True, env=_child_env(args.smoke))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        result: dict[str, Any] = {"status": "timeout"}
    else:
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{") and MARK in line]
        result = lines[-1] if lines else {"status": "killed" if proc.returncode < 0 else "error",
                                          "returncode": proc.returncode, "stderr_tail": err[-1500:]}
    result.pop(MARK, None)
    return {"depth": depth, "params": depth * block_params(args.width), **result,
            "seconds": round(time.perf_counter() - start, 1)}


def _query(code: str, smoke: bool) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=_child_env(smoke)).stdout.strip()


def _host_available() -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


def _start_and_cap(args: argparse.Namespace, offload: bool) -> tuple[int, int, str]:
    """Where the search starts, its cap and what sets the cap."""
    per_block = block_params(args.width)
    if args.smoke:
        return 1, args.max_depth, "--max-depth"
    if offload:
        host_cap = int((HOST_SHARE * _host_available() - HOST_RESERVE) / OFFLOAD_HOST_BYTES / per_block)
        cap = min(args.max_depth, host_cap) if args.max_depth else host_cap
        return max(1, int(0.8 * cap)), max(1, cap), "host memory" if cap == host_cap else "--max-depth"
    gpu = int(_query("import torch; print(torch.cuda.get_device_properties(0).total_memory)", smoke=False))
    estimate = max(1, int(gpu / ZERO2_BYTES / per_block))
    cap = args.max_depth or 4 * estimate
    return max(1, min(int(0.8 * estimate), cap)), cap, "--max-depth" if args.max_depth else "4x the estimate"


def _search_config(args: argparse.Namespace, zero: int, offload: bool) -> dict[str, Any] | None:
    """One config's search, printing each try; the largest try that trained (None: none did)."""
    name = f"zero{zero}" + ("_offload" if offload else "")
    start, cap, why = _start_and_cap(args, offload)
    print(json.dumps({"config": name, "width": args.width, "block_params": block_params(args.width),
                      "start_depth": start, "cap_depth": cap, "cap_set_by": why}), flush=True)
    deadline = time.monotonic() + (args.budget or BUDGET_S[offload])
    passed: dict[int, dict[str, Any]] = {}

    def probe(depth: int) -> bool | None:
        left = deadline - time.monotonic()
        if left < args.min_try:
            return None
        result = _run_try(args, zero, offload, depth, min(args.try_timeout, left))
        print(json.dumps({"config": name, **result}), flush=True)
        if result["status"] == "ok":
            passed[depth] = result
            return True
        if result["status"] == "error":
            raise RuntimeError(f"{name} depth {depth} failed (not out of memory): {result}")
        if result["status"] == "timeout" and min(args.try_timeout, left) < args.try_timeout:
            return None  # cut by the budget, not too slow: no verdict
        return False  # oom, killed (host memory), or slower than --try-timeout

    lo, hi = search(probe, start, cap, args.tolerance)
    best = passed.get(lo)
    print(json.dumps({"config": name, "largest_depth": lo, "smallest_failed_depth": hi if hi <= cap else None,
                      "largest_params": best["params"] if best else 0,
                      "samples_per_s": best and best.get("samples_per_s"),
                      "tokens_per_s": best and best.get("tokens_per_s")}), flush=True)
    return best


def _summary(results: dict[str, dict[str, Any] | None], goal: float) -> None:
    z2, off = results.get("zero2"), results.get("zero3_offload")
    ratio = off["params"] / z2["params"] if z2 and off else None
    print(json.dumps({"summary": {k: v and {"params": v["params"], "depth": v["depth"],
                                            "samples_per_s": v.get("samples_per_s"),
                                            "tokens_per_s": v.get("tokens_per_s")} for k, v in results.items()},
                      "ratio": ratio and round(ratio, 3), "goal": goal,
                      "goal_met": ratio is not None and ratio >= goal}), flush=True)
    parts = [f"{k}: {v['params']:,} parameters (depth {v['depth']}), {v.get('samples_per_s')} samples/s, "
             f"{v.get('tokens_per_s')} tokens/s" if v else f"{k}: nothing trained" for k, v in results.items()]
    tail = f"; ratio {ratio:.2f}x (goal >= {goal:g}x)" if ratio is not None else ""
    print("largest model on one device: " + "; ".join(parts) + tail, flush=True)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zero", type=int, choices=(2, 3), help="one search (default: ZeRO-2, then ZeRO-3 + offload)")
    parser.add_argument("--offload", action="store_true", help="with --zero 3: offload parameters and optimizer")
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--seq", type=int, default=1024, help="tokens of the one sequence of a step")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="steps before the timing starts")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds of tries per config (0: 100 for ZeRO-2, 150 for offload)")
    parser.add_argument("--try-timeout", type=float, default=120.0)
    parser.add_argument("--min-try", type=float, default=15.0, help="no try starts with less budget left")
    parser.add_argument("--tolerance", type=float, default=0.1)
    parser.add_argument("--max-depth", type=int, default=0, help="cap on the depth (0: from memory)")
    parser.add_argument("--optimizer", choices=("torch", "cpu_adam"), default="torch",
                        help="cpu_adam: DeepSpeed's CPU Adam for offload (its op must be built)")
    parser.add_argument("--goal", type=float, default=3.0)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, a fake memory limit")
    parser.add_argument("--fake-oom-above", type=int, default=0, help="parameters above which a try is an OOM")
    args = parser.parse_args(argv)
    if args.offload and args.zero != 3:
        parser.error("--offload goes with --zero 3")
    if args.smoke:
        args.width, args.seq, args.steps, args.warmup, args.tolerance = 16, 4, 3, 1, 0.0
        args.max_depth = args.max_depth or 4
        args.fake_oom_above = args.fake_oom_above or 3 * block_params(16)
        args.budget, args.try_timeout, args.min_try = max(args.budget, 600.0), max(args.try_timeout, 300.0), 0.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    configs = [(args.zero, args.offload)] if args.zero else [(2, False), (3, True)]
    results = {f"zero{z}" + ("_offload" if o else ""): _search_config(args, z, o) for z, o in configs}
    _summary(results, args.goal)
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
