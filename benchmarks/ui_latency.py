"""Latency of the dashboard's API with many pages open: `det-trials ui` over a synthetic run folder, polled by
50 clients at once, each on a keep-alive connection of its own, as open browser tabs poll it.

Usage: python benchmarks/ui_latency.py [--clients 50] [--rounds 7] [--polls 4] [--interval 1.5] [--quick]

The store: one experiment of 6 trials x 300 training and 30 validation reports (``make_store`` of
tests/support/helpers_ui.py), the size of a small search such as the one the dashboard was tried on (6 trials of
270 batches). Each client polls what a page asks every ``--interval`` seconds (the page's rhythm), starting at a
random offset, alternating the experiment page's calls and a trial page's; a round is ``--polls`` polls of every
client. Each call's p50/p95/p99 is taken per round; the figures are the medians over the rounds. Target: p50 at
most 5 ms per API call on a 2-core machine.
"""

from __future__ import annotations

import argparse
import http.client
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from helpers_ui import make_store, running_ui  # noqa: E402

__all__ = ["main"]

TRIALS = 6
TRAINING_ROWS, VALIDATION_ROWS = 300, 30
EXPERIMENT_PAGE = ["/api/v1/experiments", "/api/v1/experiments/1", "/api/v1/experiments/1/trials",
                   "/api/v1/experiments/1/metrics?group=validation&metric=validation_loss&max_points=300"]
TRIAL_PAGE = ["/api/v1/trials/{t}", "/api/v1/trials/{t}/metrics?group=training&max_points=1000",
              "/api/v1/trials/{t}/metrics?group=validation&max_points=1000", "/api/v1/trials/{t}/checkpoints",
              "/api/v1/trials/{t}/logs?tail=200"]
TARGET_P50_MS = 5.0

Timings = dict[str, list[float]]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _client(base: str, token: str, index: int, polls: int, interval: float, start: float, out: Timings,
            lock: threading.Lock, failures: list[str]) -> None:
    """One open page: ``polls`` polls ``interval`` apart from ``start`` on one keep-alive connection."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {"Authorization": f"Bearer {token}"}
    mine: Timings = defaultdict(list)
    try:
        for poll in range(polls):
            time.sleep(max(0.0, start + poll * interval - time.monotonic()))
            trial_page = (index + poll) % 2 == 1
            for template in TRIAL_PAGE if trial_page else EXPERIMENT_PAGE:
                path = template.format(t=1 + (index % TRIALS))
                began = time.perf_counter()
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                response.read()
                mine[template.split("&max_points")[0]].append((time.perf_counter() - began) * 1000)
                if response.status != 200:
                    failures.append(f"{path}: {response.status}")
    finally:
        conn.close()
    with lock:
        for name, values in mine.items():
            out[name].extend(values)


def _round(base: str, token: str, clients: int, polls: int, interval: float, rng: random.Random) -> Timings:
    out: Timings = defaultdict(list)
    lock = threading.Lock()
    failures: list[str] = []
    now = time.monotonic() + 0.2
    threads = [threading.Thread(target=_client, args=(base, token, i, polls, interval,
                                                      now + rng.uniform(0, interval), out, lock, failures))
               for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"requests failed: {failures[:5]}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--polls", type=int, default=4, help="polls of each client per round")
    parser.add_argument("--interval", type=float, default=1.5, help="seconds between a client's polls")
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 clients, 2 rounds, 2 polls 0.2 s apart")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.rounds, args.polls, args.interval = 5, 2, 2, 0.2
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "runs"
        make_store(run_dir, trials=TRIALS, training_rows=TRAINING_ROWS, validation_rows=VALIDATION_ROWS,
                   name="latency").close()
        with running_ui(run_dir) as (base, token):
            _round(base, token, min(args.clients, 5), 1, 0.0, rng)  # warm: SQLite's cache, the thread pool
            rounds = [_round(base, token, args.clients, args.polls, args.interval, rng) for _ in range(args.rounds)]
    names = list(rounds[0])
    print(f"det-trials ui: {args.clients} clients polling every {args.interval} s on keep-alive connections, "
          f"{args.rounds} rounds of {args.polls} polls; ms, medians over the rounds of each round's percentile")
    print(f"{'call':<72} {'p50':>7} {'p95':>7} {'p99':>7} {'n/round':>8}")
    for name in [*names, "all calls"]:
        per_round = [sum(r.values(), []) if name == "all calls" else r[name] for r in rounds]
        figures = [statistics.median(_percentile(v, q) for v in per_round) for q in (0.5, 0.95, 0.99)]
        print(f"{name:<72} {figures[0]:7.2f} {figures[1]:7.2f} {figures[2]:7.2f} {len(per_round[0]):8d}")
    overall = statistics.median(_percentile(sum(r.values(), []), 0.5) for r in rounds)
    print(f"ui latency p50 over all API calls: {overall:.2f} ms (target <= {TARGET_P50_MS:.0f} ms)")


if __name__ == "__main__":
    main()
