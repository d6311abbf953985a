"""One definition of progress (core/_progress.py, docs/ui.md): a trial's is what it trained over the most it trains
(135 of 270 batches: 50 %), stored with the report of the same batches; an experiment's is its trials' summed over
the trials its searcher runs, and never goes back while the experiment runs (trials made, promoted, completed)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from trials_pytorch import LinearTrial, config

import determined_trials as det
from determined_trials import pytorch
from determined_trials.core._progress import experiment_progress, planned_trials, trial_progress
from determined_trials.core._searcher import SingleOperationSource
from determined_trials.core.store import _report_buffer
from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")


def test_a_trials_progress_is_batches_over_its_full_length() -> None:
    assert trial_progress(135, 270) == 0.5
    assert trial_progress(0, 270) == 0.0 and trial_progress(270, 270) == 1.0 and trial_progress(300, 270) == 1.0
    assert trial_progress(3, 0) == 1.0  # a zero length is no division by zero


@pytest.mark.parametrize(("searcher", "planned"), [
    ({"name": "single", "max_length": 5}, 1),
    ({"name": "random", "max_trials": 6, "max_length": 5}, 6),
    ({"name": "adaptive_asha", "max_trials": 16, "max_length": 5}, 16),
    ({"name": "grid", "max_length": 5}, 6),
    ({"name": "custom"}, None),
])
def test_the_planned_trials_come_from_the_searcher(searcher: dict[str, Any], planned: int | None) -> None:
    space = {"lr": {"type": "categorical", "vals": [0.1, 0.01, 0.001]}, "opt": {"type": "categorical",
                                                                         "vals": ["sgd", "adam"]}}
    assert planned_trials({"searcher": searcher, "hyperparameters": space}) == planned
    assert planned_trials({}) is None


def test_experiment_progress_never_goes_back_while_trials_are_made_and_complete() -> None:
    """Six planned trials, at most three running: trials are made one at a time (counting 0), train in uneven
    steps, sometimes complete early (an ASHA stop) or fail, and the last ones are made late. The issue's sequence
    (80 %, 87 %, 100 % with 5 of 6 trials, then 83 %) cannot happen: 5 done trials of 6 are 83 %, never 100 %."""
    rng = random.Random(7)
    planned, trials, seen = 6, [], []
    while len(trials) < planned or any(state == "ACTIVE" for state, _ in trials):
        running = [i for i, (state, _) in enumerate(trials) if state == "ACTIVE"]
        if len(trials) < planned and len(running) < 3 and rng.random() < 0.5:
            trials.append(("ACTIVE", None))
        elif running:
            i = rng.choice(running)
            progress = min(1.0, (trials[i][1] or 0.0) + rng.choice([0.1, 0.25, 0.5]))
            roll = rng.random()
            trials[i] = ("COMPLETED" if progress >= 1.0 or roll < 0.1 else "ERROR" if roll < 0.15 else "ACTIVE",
                         progress)
        value = experiment_progress(trials, planned)
        assert value is not None
        seen.append(value)
        if len(trials) == 5 and all(state != "ACTIVE" for state, _ in trials):
            assert value == pytest.approx(5 / 6)
    assert all(b >= a for a, b in zip(seen, seen[1:])), seen
    assert seen[-1] == 1.0
    assert experiment_progress([], None) is None and experiment_progress([], 4) == 0.0
    assert experiment_progress([("ACTIVE", 0.5)] * 3, None) == 0.5  # no plan: the trials made are the plan


def test_fit_reports_batches_over_the_searchers_full_length_across_operations(tmp_path: Path) -> None:
    """Operations of 3 then 8 batches (as ASHA hands a promoted trial): progress is batches / 8 throughout, never
    1.0 at the first operation's end and then back."""
    seen: list[float] = []
    with pytorch.init(exp_conf=config({"global_batch_size": 1}), run_dir=tmp_path) as context:
        core = context._core
        assert core is not None
        core.searcher._source = SingleOperationSource(3, 8)
        original = core.train.report_progress
        core.train.report_progress = lambda p: (seen.append(p), original(p))[1]  # type: ignore[method-assign]
        pytorch.Trainer(LinearTrial(context), context).fit(reporting_period=Batch(1), show_progress=False)
    assert seen == [b / 8 for b in range(1, 9)]


def test_progress_is_stored_with_the_report_of_the_same_batches(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(_report_buffer.time, "monotonic", lambda: now[0])
    conf = {"name": "p", "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 270}}}
    with det.core.init(config=conf, run_dir=tmp_path) as ctx:
        trial_id = ctx.info.trial.trial_id
        for batches in range(5, 270, 5):
            now[0] += 0.3  # reports 0.3 s apart: stored every fourth, the progress with them
            ctx.train.report_progress(trial_progress(batches, 270))
            ctx.train.report_training_metrics(batches, {"loss": 1.0 / batches})
            if batches % 35 == 0:
                ctx.train.flush_reports()  # as a checkpoint does, before it is recorded (from its writer thread)
            store = det.core.LocalStore(tmp_path)
            stored_batches = max(r.steps_completed for r in store.metrics(trial_id, "training"))
            assert store.trial(trial_id).progress == pytest.approx(stored_batches / 270), batches
            store.close()
        ctx.train.report_progress(1.0)  # the end is stored at once
        assert det.core.LocalStore(tmp_path).trial(trial_id).progress == 1.0
