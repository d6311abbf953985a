"""Instructions, cache misses and branch mispredictions of ``Trainer.fit`` against the raw loop, counted
by valgrind's callgrind (deterministic, unlike wall time on a shared machine).

Usage: python benchmarks/instructions.py [--batches 2000] [--variant] [--no-sim]   (needs ``valgrind`` on PATH)

The ``raw`` and ``trial`` modes of ``overhead.py`` (no checkpoints during training; ``fit`` still ends
with one) each run once in a child process under ``valgrind --tool=callgrind --cache-sim=yes
--branch-sim=yes``. Only the measured part is counted, the same part ``overhead.py`` times: the child
runs it inside ``functools.reduce`` and callgrind collects only while that C function runs
(``--toggle-collect=functools_reduce``). Start-up, imports, data and model construction and
``det.pytorch.init()`` are outside, in both modes. A run takes ~2 min per mode (callgrind is ~250x
slower than the CPU). The cache and branch figures are callgrind's simulation (first-level caches of
the machine it runs on, a simple branch predictor), not hardware counters; they compare the two modes.
Kernel time (system calls, fsync waits) is not counted: that part shows in ``overhead.py`` only.
``--no-sim`` counts instructions alone (no cache or branch simulation; several times faster).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # noqa: E402 - a sibling script, found through the line above

__all__ = ["main"]

MODES = ("raw", "trial")
SHOWN = {  # callgrind event -> what it counts
    "Ir": "instructions",
    "I1mr": "L1 instruction-cache misses",
    "D1mr": "L1 data-cache read misses",
    "D1mw": "L1 data-cache write misses",
    "Bcm": "conditional branches mispredicted",
    "Bim": "indirect branches mispredicted",
}


def _in_reduce(measured: Callable[[], Any]) -> Any:
    """Run ``measured`` inside ``functools.reduce``, the C function callgrind collects in."""
    return functools.reduce(lambda _first, _second: measured(), (0, 1))


def _child(mode: str, args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="det-instructions-"))
    try:
        if mode == "raw":
            overhead._raw_loop(args, False, work, region=_in_reduce)
        else:
            overhead._trial_fit(args, False, work, region=_in_reduce)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _totals(out_file: Path) -> dict[str, int]:
    """The ``events:`` and ``totals:`` lines of a callgrind output file, as {event: count}."""
    events: list[str] = []
    totals: list[int] = []
    for line in out_file.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("totals:", "summary:")):
            totals = [int(value) for value in line.split()[1:]]
    if not events or not totals:
        raise RuntimeError(f"{out_file} has no events/totals lines; did callgrind finish?")
    return dict(zip(events, totals))


def _measure(mode: str, args: argparse.Namespace, work: Path) -> dict[str, int]:
    out_file = work / f"callgrind.{mode}.out"
    simulate = [] if args.no_sim else ["--cache-sim=yes", "--branch-sim=yes"]
    cmd = ["valgrind", "--tool=callgrind", *simulate, "--toggle-collect=functools_reduce",
           f"--callgrind-out-file={out_file}",
           sys.executable, str(Path(__file__).resolve()), "--child", mode, *overhead.shape_argv(args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=overhead.child_env(), timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"callgrind run of {mode} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return _totals(out_file)


def _report(counts: dict[str, dict[str, int]], args: argparse.Namespace) -> None:
    raw, trial = counts["raw"], counts["trial"]
    print(f"\n{args.batches} batches of 32, validation every {args.period}, "
          f"{'default reporting, momentum, torch.Generator' if args.variant else f'reporting every {args.report}'}; "
          "callgrind counts of the measured part:")
    print(f"{'event':<6}{'raw':>16}{'trial':>16}{'trial/raw':>11}{'per batch':>12}  what")
    for event, what in SHOWN.items():
        if event not in raw or event not in trial:
            continue  # not simulated (--no-sim)
        per_batch = (trial[event] - raw[event]) / args.batches
        print(f"{event:<6}{raw[event]:>16,}{trial[event]:>16,}{trial[event] / raw[event]:>10.4f}x"
              f"{per_batch:>+12,.0f}  {what}")


def main() -> None:
    """Parse the arguments; run one child, or both modes under callgrind and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    overhead.add_shape_arguments(parser)
    parser.add_argument("--no-sim", action="store_true", help="instructions only: no cache or branch simulation")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per mode")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    overhead.check_at_least_one(parser, args, ("batches", "period", "report"))
    if args.child:
        _child(args.child, args)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on PATH; install it (Debian/Ubuntu: apt-get install valgrind) to count "
                 "instructions, or use benchmarks/overhead.py for wall time")
    with tempfile.TemporaryDirectory(prefix="det-callgrind-") as tmp:
        counts = {}
        for mode in MODES:
            print(f"counting {mode} under callgrind ...", flush=True)
            counts[mode] = _measure(mode, args, Path(tmp))
    _report(counts, args)


if __name__ == "__main__":
    main()
