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
trials from its record (`load_state_dict`, at `experiment continue`).

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


def best_after(name: str, seed: int, trials: int) -> float:
    """The smallest noisy metric one search of `name` found (grid: its 36 points)."""
    searcher, noise = _searcher(name, seed, trials), random.Random(seed * 7919 + 1)
    pending, best = list(searcher.initial_trials()), math.inf
    while pending:
        request = pending.pop(0)
        hp = request.hparams
        metric = branin(hp["x1"], hp["x2"]) + noise.gauss(0.0, 0.1)
        best = min(best, metric)
        pending.extend(searcher.on_validation(request.request_id, 1, metric))
    return best


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
