"""Every benchmark figure in one run (``make benchmark``): per-batch overhead (project shape and the
momentum/Generator/default-reporting variant), async checkpoint blocking, resume cost, trial start.

Usage: python benchmarks/run_all.py [--quick]. Each part prints its own rounds and summary; the
last lines repeat the summaries. Ratios are against baselines measured in the same run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
PARTS = (
    ("overhead", ["overhead.py"]),
    ("overhead, variant", ["overhead.py", "--variant"]),
    ("async checkpoints", ["async_checkpoint.py"]),
    ("resume cost", ["resume_cost.py"]),
    ("trial start", ["trial_start.py"]),
)
_SUMMARY_PREFIXES = ("trial / raw", "trial-ckpt / raw-ckpt", "async ", "resume into", "trial process start",
                     "search of", "warm / cold")


def main() -> None:
    """Run each benchmark script in turn (``--quick`` passed on) and collect the summary lines."""
    extra = [a for a in sys.argv[1:] if a == "--quick"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    summary: list[str] = []
    for title, script in PARTS:
        print(f"\n=== {title} ===", flush=True)
        proc = subprocess.run([sys.executable, str(HERE / script[0]), *script[1:], *extra], env=env,
                              stdout=subprocess.PIPE, text=True, timeout=1800)
        lines = [line for line in proc.stdout.splitlines() if not line.startswith("[")]
        print("\n".join(lines), flush=True)
        if proc.returncode != 0:
            raise SystemExit(f"{script[0]} failed with exit status {proc.returncode}")
        summary += [f"{title}: {line}" for line in lines if line.startswith(_SUMMARY_PREFIXES)]
    print(f"\n=== summary (load average {os.getloadavg()[0]:.1f} at the end) ===")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
