"""Checkpoints deleted after their trial's process ended (the runner's retention, ``experiment delete``) are marked
in the trial's MLflow run, whose status stays as the trial left it; an MLflow away costs one warning, nothing more."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from support.helpers_experiment import create, make_context
from support.helpers_trackers import free_port

import determined_trials as det
from determined_trials.cli.main import main
from determined_trials.config import load_config
from determined_trials.core import LocalStore
from determined_trials.core.trackers import mark_deleted_checkpoints

pytestmark = [pytest.mark.timeout(300)]


def _tags(uri: str, run_id: str) -> tuple[str, dict[str, str]]:
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    return run.info.status, {k: v for k, v in run.data.tags.items() if k.startswith("det.checkpoint.")}


def _expected(store: LocalStore, trial_id: int, deleted: set[int]) -> dict[str, str]:
    return {f"det.checkpoint.{c.steps_completed}": c.uuid + (" (deleted)" if c.steps_completed in deleted else "")
            for c in store.checkpoints(trial_id=trial_id, include_deleted=True)}


def test_the_runners_retention_and_experiment_delete_mark_an_ended_runs_checkpoints(server: str,
                                                                                   tmp_path: Path) -> None:
    # validation losses by step: the best (step 2) and the latest (step 6) are kept, the runner deletes 1, 3, 4, 5
    config, ctx = make_context(tmp_path, {"curve": [5.0, 1.0, 4.0, 3.0, 2.0, 6.0]},
                               integrations={"mlflow": {"tracking_uri": server, "experiment_name": "marks"}})
    runs = tmp_path / "runs"
    assert create(runs, config, ctx) == 0
    store = LocalStore(runs)
    assert sorted(c.steps_completed for c in store.checkpoints(trial_id=1)) == [2, 6]
    run = store.tracker_run(1, "mlflow")
    assert run is not None
    status, tags = _tags(server, run["run_id"])
    assert status == "FINISHED"  # ended by the trial before the deletions; marking it did not reopen it
    assert tags == _expected(store, 1, deleted={1, 3, 4, 5})
    gone = {c.uuid for c in store.checkpoints(trial_id=1, include_deleted=True) if c.state == "DELETED"}
    assert {f"deleted:{uuid}" for uuid in gone} <= set(run["checkpoints"])  # each marked once

    every = _expected(store, 1, deleted={1, 2, 3, 4, 5, 6})
    assert main(["--run-dir", str(runs), "experiment", "delete", "1", "--yes"]) == 0
    assert _tags(server, run["run_id"]) == ("FINISHED", every)  # the run outlives the experiment, its files do not


def _trial_with_checkpoints(server: str, run_dir: Path) -> tuple[LocalStore, dict[str, Any]]:
    """A plain Core API trial logged to ``server``: checkpoints at steps 1, 2, 3, its run FINISHED."""
    config = {"name": "away", "searcher": {"name": "single", "metric": "loss", "max_length": 3},
              "integrations": {"mlflow": {"tracking_uri": server}}}
    with det.core.init(config=config, run_dir=run_dir) as ctx:
        for step in (1, 2, 3):
            ctx.train.report_training_metrics(step, {"loss": 1.0 / step})
            with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
                (path / "state.json").write_text(json.dumps({"step": step}))
    return LocalStore(run_dir), config


def test_an_mlflow_away_is_one_warning_and_a_later_call_marks(server: str, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    store, config = _trial_with_checkpoints(server, tmp_path)
    first, second, _ = store.checkpoints(trial_id=1)
    for checkpoint in (first, second):  # deleted after the trial's process ended, as the runner would
        store.mark_checkpoint_deleted(checkpoint.uuid)
    run_id = store.tracker_run(1, "mlflow")["run_id"]

    away = {**config, "integrations": {"mlflow": {"tracking_uri": f"http://127.0.0.1:{free_port()}"}}}
    with caplog.at_level(logging.WARNING, logger="determined_trials.trackers"):
        mark_deleted_checkpoints(store, load_config(away), [1])
    warnings = [r.getMessage() for r in caplog.records if r.name == "determined_trials.trackers"]
    assert len(warnings) == 1 and "trial(s) 1" in warnings[0] and "does not answer" in warnings[0], warnings
    assert _tags(server, run_id) == ("FINISHED", _expected(store, 1, deleted=set()))
    assert not [m for m in store.tracker_run(1, "mlflow")["checkpoints"] if m.startswith("deleted:")]

    caplog.clear()
    mark_deleted_checkpoints(store, load_config(config), [1])  # the tracker answers again: the marks not made are made now
    assert _tags(server, run_id) == ("FINISHED", _expected(store, 1, deleted={1, 2}))
    marks = [m for m in store.tracker_run(1, "mlflow")["checkpoints"] if m.startswith("deleted:")]
    assert marks == [f"deleted:{first.uuid}", f"deleted:{second.uuid}"]
    assert not caplog.records
