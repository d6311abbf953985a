"""Instructions, cache misses and branch mispredictions of ``Trainer.fit`` against the raw loop, counted
by valgrind's callgrind (deterministic, unlike wall time on a shared machine).

Usage: python benchmarks/instructions.py [--batches 2000] [--variant] [--no-sim]   (needs ``valgrind`` on PATH)

The ``raw`` and ``trial`` modes of ``overhead.py`` (no checkpoints during training; ``fit`` still ends
with one) each run once in a child process under ``valgrind --tool=callgrind --cache-sim=yes
--branch-sim=yes``. Only the measured part is counted, the same part ``overhead.py`` times: the child
runs it inside ``functools.reduce`` and callgrind collects only while that C function runs
(``--toggle-collect=functools_reduce``). Start-up, imports, data and model construction and
``det.pytorch.init()`` are outside, in both modes, and run uninstrumented (``--instr-atstart=no``): the
child waits just before the measured part until ``callgrind_control -i on`` has switched instrumentation
on (torch's import alone takes ~55 s instrumented, ~14 s not; the counts are the same to a few
instructions). A run takes ~2 min per mode (callgrind is ~250x slower than the CPU). The cache and
branch figures are callgrind's simulation (first-level caches of the machine it runs on, a simple
branch predictor, both fed from the measured part's start), not hardware counters; they compare the
two modes.
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
import time
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


_POLL_S = 0.02  # the waiting child runs Python between sleeps, so valgrind's gdbserver sees the request


def _in_reduce(measured: Callable[[], Any], handshake: Path | None = None, timeout: float = 0.0) -> Any:
    """Run ``measured`` inside ``functools.reduce``, the C function callgrind collects in; with a
    ``handshake`` folder, first say ``ready`` there and wait for ``go`` (instrumentation switched on)."""
    if handshake is not None:
        (handshake / "ready").touch()
        deadline = time.monotonic() + timeout
        while not (handshake / "go").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no 'go' in {handshake} within {timeout:.0f} s")
            time.sleep(_POLL_S)
    return functools.reduce(lambda _first, _second: measured(), (0, 1))


def _child(mode: str, args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    handshake = Path(args.handshake) if args.handshake else None
    region = functools.partial(_in_reduce, handshake=handshake, timeout=args.timeout)
    work = Path(tempfile.mkdtemp(prefix="det-instructions-"))
    try:
        if mode == "raw":
            overhead._raw_loop(args, False, work, region=region)
        else:
            overhead._trial_fit(args, False, work, region=region)
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
    out_file, handshake, log = work / f"callgrind.{mode}.out", work / f"handshake.{mode}", work / f"{mode}.log"
    handshake.mkdir()
    simulate = [] if args.no_sim else ["--cache-sim=yes", "--branch-sim=yes"]
    cmd = ["valgrind", "--tool=callgrind", *simulate, "--instr-atstart=no", "--toggle-collect=functools_reduce",
           f"--callgrind-out-file={out_file}", sys.executable, str(Path(__file__).resolve()), "--child", mode,
           "--handshake", str(handshake), "--timeout", str(args.timeout), *overhead.shape_argv(args)]
    deadline = time.monotonic() + args.timeout
    with log.open("w") as output:
        proc = subprocess.Popen(cmd, stdout=output, stderr=subprocess.STDOUT, env=overhead.child_env())
        try:
            _instrument_when_ready(proc, handshake, deadline)
            returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if returncode != 0:
        raise RuntimeError(f"callgrind run of {mode} failed (exit {returncode}):\n{log.read_text()[-4000:]}")
    return _totals(out_file)


def _instrument_when_ready(proc: subprocess.Popen[bytes], handshake: Path, deadline: float) -> None:
    """Once the child says ``ready``: switch callgrind's instrumentation on in it, then say ``go``."""
    while not (handshake / "ready").exists():
        if proc.poll() is not None:
            return  # it ended before the measured part; the caller reports its exit and output
        if time.monotonic() > deadline:
            raise TimeoutError("the child did not reach the measured part in time")
        time.sleep(_POLL_S)
    switch = subprocess.run(["callgrind_control", "--instr=on", str(proc.pid)], capture_output=True, text=True,
                            timeout=max(1.0, deadline - time.monotonic()))
    if switch.returncode != 0 or "OK" not in switch.stdout:
        raise RuntimeError(f"callgrind_control could not switch instrumentation on:\n{switch.stdout}{switch.stderr}")
    (handshake / "go").touch()


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
    parser.add_argument("--handshake", help=argparse.SUPPRESS)
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
