"""An optuna search run by the real runner: the runner is killed with SIGKILL mid-search, `experiment continue`
goes on with the same study, rebuilt from the searcher state the runner saved in the store: max_trials trials in
all, none run twice (a trial the killed runner had just created is adopted, not created again)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from support.helpers_experiment import make_context, start_runner

from determined_trials.cli.main import main
from determined_trials.core import LocalStore
from determined_trials.searcher import restore_study

optuna = pytest.importorskip("optuna")


def _wait_for_completed(run_dir: Path, proc: psutil.Popen, count: int) -> None:
    deadline = time.monotonic() + 180
    while sum(t.state == "COMPLETED" for t in LocalStore(run_dir).trials(1)) < count:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.slow
def test_an_optuna_search_continues_after_the_runner_was_killed(tmp_path: Path) -> None:
    config, ctx = make_context(
        tmp_path, {"lr": {"type": "double", "minval": 0.1, "maxval": 0.9}, "sleep": 0.1, "ckpt_every": 2},
        searcher={"name": "optuna", "metric": "loss", "max_length": 4, "max_trials": 6,
                  "max_concurrent_trials": 2})
    run_dir = tmp_path / "runs"
    proc = start_runner(run_dir, config, ctx, tmp_path / "create.out")
    try:
        _wait_for_completed(run_dir, proc, 2)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.kill()  # kill -9 the runner mid-search
        proc.wait(timeout=60)
        psutil.wait_procs(children, timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    store = LocalStore(run_dir)
    before = {t.id for t in store.trials(1) if t.state == "COMPLETED"}
    assert 2 <= len(before) < 6
    assert main(["--run-dir", str(run_dir), "experiment", "continue", "1", "--no-progress"]) == 0
    trials = store.trials(1)
    assert store.experiment(1).state == "COMPLETED"
    assert len(trials) == 6 and all(t.state == "COMPLETED" for t in trials)
    for trial in trials:  # each trial trained once to 4: at most resumed from its checkpoint, never from scratch
        steps = [m.steps_completed for m in store.metrics(trial.id, "training")]
        assert sorted(set(steps)) == [1, 2, 3, 4] and steps.count(1) == 1
    study = restore_study(store.experiment(1).searcher_state["searcher"]["study"])  # the study's one record
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    assert sorted(t.params["lr"] for t in done) == sorted(t.hparams["lr"] for t in trials)  # one ask per trial
    assert len(done) == len(study.trials) == 6  # no other ask: a trial asked is one the runner saved and ran
