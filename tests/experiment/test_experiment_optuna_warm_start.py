"""`searcher.warm_start` of an optuna search: the completed trials of earlier experiments in the run folder are in
the study before its first suggestion (those that do not fit the space skipped with one message), an unknown
experiment id is a config error at create, and a paused and continued search adds none of them twice."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.helpers_experiment import DET_TRIALS, make_context, when_stored

from determined_trials.cli.main import main
from determined_trials.core import LocalStore
from determined_trials.errors import ConfigError
from determined_trials.experiment import create_experiment
from determined_trials.searcher import OptunaSearch, restore_study

optuna = pytest.importorskip("optuna")

_SPACE = {"lr": {"type": "double", "minval": 0.1, "maxval": 0.9}}
_EARLIER = [(0.2, 0.64), (0.5, 0.25), (0.8, 0.04), (5.0, 0.01)]  # (lr, loss); lr 5.0 is outside the new range


def _record_earlier(run_dir: Path) -> int:
    """An earlier optuna experiment as its runner would have recorded it: four completed trials (searcher op and
    validation at length 4) and one that failed (no result: left out)."""
    store = LocalStore(run_dir)
    exp = store.create_experiment(name="earlier", config={"searcher": {"name": "optuna", "metric": "loss"}})
    for lr, loss in _EARLIER:
        trial = store.create_trial(experiment_id=exp, hparams={"lr": lr, "target": 1.0}, seed=1)
        store.add_metrics(trial_id=trial, group="validation", steps_completed=4, metrics={"loss": loss + 1.0})
        store.record_searcher_op(trial, 4, loss, True)  # the value the search read: the op's
        store.set_trial_state(trial, "COMPLETED")
    failed = store.create_trial(experiment_id=exp, hparams={"lr": 0.3, "target": 1.0}, seed=1)
    store.set_trial_state(failed, "ERROR", "boom")
    store.set_experiment_state(exp, "COMPLETED")
    store.close()
    return exp


def _searcher(**extra: Any) -> dict[str, Any]:
    return {"name": "optuna", "metric": "loss", "max_length": 2, "max_trials": 1, **extra}


def test_the_study_holds_the_earlier_trials_before_its_first_suggestion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    run_dir = tmp_path / "runs"
    earlier = _record_earlier(run_dir)
    seen: list[list[tuple[str, dict[str, Any], float | None]]] = []
    ask = OptunaSearch._hparams_for

    def spy(self: OptunaSearch, request_id: int) -> dict[str, Any]:
        seen.append([(t.state.name, t.params, t.value) for t in self.study.trials])
        return ask(self, request_id)

    monkeypatch.setattr(OptunaSearch, "_hparams_for", spy)
    config, ctx = make_context(tmp_path, _SPACE, searcher=_searcher(warm_start={"experiments": [earlier, earlier]}))
    result = create_experiment(config, ctx, run_dir=run_dir)
    assert result.state == "COMPLETED"
    told = [("COMPLETE", {"lr": lr}, loss) for lr, loss in _EARLIER[:3]]  # the ops' values, each trial once
    assert seen == [told]
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "searcher.warm_start" in line]
    assert len(lines) == 1, out  # one message: what the study holds, how many skipped and the first reason
    assert "the study starts with 3 trial(s) of experiment(s) 1" in lines[0]
    assert "1 skipped, the first as trial 4: its 'lr' = 5.0 is outside the range [0.1, 0.9]" in lines[0]
    study = restore_study(LocalStore(run_dir).experiment(result.experiment_id).searcher_state["searcher"]["study"])
    assert [t.value for t in study.trials[:3]] == [loss for _, loss in _EARLIER[:3]]
    assert len(study.trials) == 4  # the earlier three, then the one asked
    assert main(["--run-dir", str(run_dir), "experiment", "describe", str(result.experiment_id)]) == 0
    assert re.search(r"\n  study told: +the completed trials of experiment\(s\) 1\n", capsys.readouterr().out)


def test_the_metric_is_read_from_validations_when_the_earlier_search_had_another(tmp_path: Path) -> None:
    from determined_trials.config import load_config
    from determined_trials.experiment._study_warm_start import earlier_trials

    run_dir = tmp_path / "runs"
    store = LocalStore(run_dir)
    exp = store.create_experiment(name="earlier", config={"searcher": {"name": "optuna", "metric": "acc"}})
    for lr, length in ((0.2, 8), (0.4, 2)):  # the second was stopped at a rung by its search
        trial = store.create_trial(experiment_id=exp, hparams={"lr": lr}, seed=1)
        store.add_metrics(trial_id=trial, group="validation", steps_completed=length, metrics={"loss": lr})
        store.record_searcher_op(trial, length, 0.9, True)
        store.set_trial_state(trial, "COMPLETED")
    config = load_config({"entrypoint": "python3 x.py", "hyperparameters": _SPACE,
                          "searcher": _searcher(warm_start={"experiments": [exp]})})
    warm = earlier_trials(config, store)
    assert warm is not None
    assert warm.found == [("trial 1", {"lr": 0.2}, 0.2)]
    assert warm.skipped == ["trial 2: its search stopped it at length 2 of 8"]


def test_an_unknown_experiment_is_a_config_error_at_create(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs"
    _record_earlier(run_dir)
    config, ctx = make_context(tmp_path, _SPACE, searcher=_searcher(warm_start={"experiments": [1, 9]}))
    with pytest.raises(ConfigError, match="searcher.warm_start.experiments: there is no experiment 9"):
        create_experiment(config, ctx, run_dir=run_dir)
    assert [e.id for e in LocalStore(run_dir).experiments()] == [1]  # nothing recorded, nothing run


@pytest.mark.slow
def test_a_continued_search_adds_nothing_twice(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs"
    earlier = _record_earlier(run_dir)
    config, ctx = make_context(
        tmp_path, {**_SPACE, "sleep": 0.2}, searcher=_searcher(max_length=8, max_trials=3, max_concurrent_trials=1,
                                                              warm_start={"experiments": [earlier]}))
    with open(tmp_path / "create.out", "wb") as out:
        proc = subprocess.Popen([*DET_TRIALS, "--run-dir", str(run_dir), "experiment", "create", str(config),
                                 str(ctx), "--no-progress"], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        when_stored(run_dir, lambda s: any(c.trial_id == 6 for c in s.checkpoints()), timeout=120)
        proc.send_signal(signal.SIGTERM)  # pause the search during its first trial
        assert proc.wait(timeout=60) == 75
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    store = LocalStore(run_dir)
    assert store.experiment(2).state == "PAUSED"
    assert main(["--run-dir", str(run_dir), "experiment", "continue", "2", "--no-progress"]) == 0
    assert store.experiment(2).state == "COMPLETED"
    trials = store.trials(2)
    assert len(trials) == 3
    study = restore_study(store.experiment(2).searcher_state["searcher"]["study"])
    assert [t.params["lr"] for t in study.trials[:3]] == [lr for lr, _ in _EARLIER[:3]]  # once, first
    assert sorted(t.params["lr"] for t in study.trials[3:]) == sorted(t.hparams["lr"] for t in trials)
    assert len(study.trials) == 6 and all(t.state.name == "COMPLETE" for t in study.trials)
