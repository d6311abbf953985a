"""How well the searchers find a known optimum, and the optuna searcher's own cost per suggestion.

The trial is simulated: its validation metric is the Branin function of two hyperparameters (minimum
0.397887) plus two irrelevant hyperparameters and Gaussian noise (sd 0.1). Each searcher is the object the
runner uses (`make_searcher` of a config), driven through the `Searcher` interface one trial at a time.
For 7 seeds (rounds, the searchers interleaved in each): the best metric after 40 trials of optuna/tpe,
random and grid (a 6 x 6 grid over the two that matter: 36 trials), their medians and the median per-round
ratio of regrets (best - 0.397887) of tpe to random. Then optuna/tpe's own cost per suggestion at 200
finished trials, as the runner pays it: tell + ask (`on_validation`) and the two saves of the search with the
study's record (`state_dict()` written to the run's store, at the trial's end and at the next trial's start);
the median of the 11 suggestions from 195 to 205 finished, over 3 seeds. And the cost of rebuilding the study of 200
trials from its record (`load_state_dict`, at `experiment continue`). And the warm start (`searcher.warm_start`):
for the same 7 seeds, the median best of TPE searches of 40 trials in all: one cold search of 40; a cold search of 20
then a search of 20 told its trials first (`OptunaSearch.tell_earlier`, best over both); and, to show what telling
adds, the same two searches of 20 with the second one cold.

    python benchmarks/search_quality.py [--rounds 7] [--trials 40]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from determined_trials.config import load_config
from determined_trials.core import LocalStore
from determined_trials.searcher import Searcher, make_searcher

BRANIN_MIN = 0.397887
SPACE: dict[str, Any] = {
    "x1": {"type": "double", "minval": -5.0, "maxval": 10.0, "count": 6},
    "x2": {"type": "double", "minval": 0.0, "maxval": 15.0, "count": 6},
    "noise_knob": {"type": "double", "minval": 0.0, "maxval": 1.0, "count": 1},
    "width": {"type": "int", "minval": 1, "maxval": 64, "count": 1},
}


def branin(x1: float, x2: float) -> float:
    """The Branin-Hoo function; its three global minima are 0.397887."""
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


def _searcher(name: str, seed: int, trials: int) -> Searcher:
    searcher: dict[str, Any] = {"name": name, "metric": "loss", "max_length": 1, "max_concurrent_trials": 1}
    if name != "grid":
        searcher["max_trials"] = trials
    if name == "optuna":
        searcher["sampler"] = "tpe"
    raw = {"searcher": searcher, "hyperparameters": SPACE, "reproducibility": {"experiment_seed": seed}}
    return make_searcher(load_config(raw))


def run_search(name: str, seed: int, trials: int,
               earlier: list[tuple[dict[str, Any], float]] | None = None) -> list[tuple[dict[str, Any], float]]:
    """Each trial's hyperparameters and noisy metric of one search of `name` (grid: its 36 points); `earlier`:
    an optuna search told those trials first, as `searcher.warm_start` does."""
    searcher, noise = _searcher(name, seed, trials), random.Random(seed * 7919 + 1)
    if earlier is not None:
        added, skipped = searcher.tell_earlier([(f"trial {i}", hp, m) for i, (hp, m) in enumerate(earlier)])
        assert added == len(earlier) and not skipped
    pending, results = list(searcher.initial_trials()), []
    while pending:
        request = pending.pop(0)
        hp = request.hparams
        metric = branin(hp["x1"], hp["x2"]) + noise.gauss(0.0, 0.1)
        results.append((hp, metric))
        pending.extend(searcher.on_validation(request.request_id, 1, metric))
    return results


def best_after(name: str, seed: int, trials: int) -> float:
    """The smallest noisy metric one search of `name` found (grid: its 36 points)."""
    return min(metric for _, metric in run_search(name, seed, trials))


def warm_start_bests(seed: int, trials: int) -> dict[str, float]:
    """TPE with `trials` trials in all, three ways: one cold search of them all; a cold search of half, then a
    second search of half warm-started from the first (the best over both); the same two halves with the second
    search cold (what the warm start adds). The second search has a seed of its own, as a new experiment has."""
    half = trials // 2
    first = run_search("optuna", seed, half)
    second_seed = seed + 1000
    best_first = min(m for _, m in first)
    return {
        "cold": best_after("optuna", seed, trials),
        "warm": min(best_first, best_after_told(second_seed, trials - half, first)),
        "two_cold": min(best_first, best_after("optuna", second_seed, trials - half)),
    }


def best_after_told(seed: int, trials: int, earlier: list[tuple[dict[str, Any], float]]) -> float:
    """The smallest metric of a warm-started optuna/tpe search's own `trials` trials."""
    return min(metric for _, metric in run_search("optuna", seed, trials, earlier))


def suggestion_costs(seed: int, folder: Path, finished: int = 200) -> tuple[list[float], list[float], float]:
    """Seconds of optuna/tpe's tell + ask and of one save of its state in a store in `folder`, for each
    suggestion with `finished` - 5 .. `finished` + 5 trials finished, and of `load_state_dict` at the end."""
    searcher, noise = _searcher("optuna", seed, finished + 6), random.Random(seed)
    store = LocalStore(folder / f"run{seed}")
    experiment = store.create_experiment(name="bench", config={})
    pending, tell_ask, save = list(searcher.initial_trials()), [], []
    done = 0
    while pending:
        request = pending.pop(0)
        metric = branin(request.hparams["x1"], request.hparams["x2"]) + noise.gauss(0.0, 0.1)
        start = time.perf_counter()
        pending.extend(searcher.on_validation(request.request_id, 1, metric))
        middle = time.perf_counter()
        store.set_searcher_state(experiment, {"searcher": searcher.state_dict()})  # as the runner saves it
        end = time.perf_counter()
        done += 1
        if finished - 5 <= done <= finished + 5:
            tell_ask.append(middle - start)
            save.append(end - middle)
    state = store.experiment(experiment).searcher_state
    store.close()
    assert state is not None
    again = _searcher("optuna", seed, finished + 6)
    start = time.perf_counter()
    again.load_state_dict(state["searcher"])
    return tell_ask, save, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()
    names = ("optuna", "random", "grid")
    bests: dict[str, list[float]] = {n: [] for n in names}
    ratios = []
    for seed in range(args.rounds):
        for name in names:
            bests[name].append(best_after(name, seed, args.trials))
        regret = {n: max(bests[n][-1] - BRANIN_MIN, 1e-9) for n in names}
        ratios.append(regret["optuna"] / regret["random"])
        print(f"seed {seed}: " + "  ".join(f"{n} {bests[n][-1]:.4f}" for n in names))
    print(f"\nmedian best after {args.trials} trials (Branin minimum {BRANIN_MIN}, noise sd 0.1, {args.rounds} seeds):")
    for name in names:
        label = "optuna/tpe" if name == "optuna" else name + (" (36 points)" if name == "grid" else "")
        print(f"  {label:18s} {statistics.median(bests[name]):.4f}")
    print(f"median per-seed regret ratio optuna/tpe : random = {statistics.median(ratios):.3f}")
    warm = [warm_start_bests(seed, args.trials) for seed in range(args.rounds)]
    half = args.trials // 2
    print("\nwarm start: " + "  ".join(f"seed {i}: " + "/".join(f"{v:.3f}" for v in w.values())
                                      for i, w in enumerate(warm)) + "  (cold / warm / two cold)")
    print(f"warm start (searcher.warm_start), optuna/tpe, median best over {args.trials} trials, {args.rounds} seeds:")
    labels = {"cold": f"one cold search of {args.trials}",
              "warm": f"{half} cold, then {args.trials - half} warm-started",
              "two_cold": f"{half} cold, then {args.trials - half} cold"}
    for key, label in labels.items():
        print(f"  {label:34s} {statistics.median(w[key] for w in warm):.4f}")
    tell_ask: list[float] = []
    save: list[float] = []
    rebuild: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(3):
            times = suggestion_costs(seed, Path(folder))
            tell_ask += times[0]
            save += times[1]
            rebuild.append(times[2])
    ms = {name: statistics.median(values) * 1000 for name, values in
          (("tell_ask", tell_ask), ("save", save), ("rebuild", rebuild))}
    print(f"optuna/tpe at 200 finished trials (median of {len(tell_ask)} suggestions, 3 seeds): tell + ask "
          f"{ms['tell_ask']:.1f} ms, one save of the state with the study's record {ms['save']:.1f} ms; per "
          f"suggestion as the runner pays it (tell + ask + 2 saves) {ms['tell_ask'] + 2 * ms['save']:.1f} ms "
          "(target <= 50 ms)")
    print(f"rebuilding the study of 206 trials from its record (experiment continue): {ms['rebuild']:.1f} ms")

if __name__ == "__main__":
    main()
