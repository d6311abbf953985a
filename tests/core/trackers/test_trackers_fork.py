"""A fork's W&B run names its parent trial's run: `det.parent_run_id` in its config (W&B's own `fork_from`
cannot be combined with the `resume="allow"` every trial's run is opened with; docs/forking.md). Other runs carry
no such key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.helpers_trackers import wandb_records

from determined_trials._info import TrialInfo
from determined_trials.config import WandbIntegration
from determined_trials.core.trackers import Outcome, TrialFacts
from determined_trials.core.trackers._wandb import WandbSink


def _run_config(tmp_path: Path, run_id: str, parent_runs: dict[str, str]) -> dict[str, Any]:
    trial = TrialInfo(trial_id=2, experiment_id=2, trial_seed=1, hparams={"lr": 0.1}, config={})
    sink = WandbSink(WandbIntegration(project="p", mode="offline"),
                     TrialFacts(trial, "fork", "loss", str(tmp_path), parent_runs=parent_runs))
    sink.resume(run_id, 0)
    sink.close(Outcome.COMPLETED)
    records = wandb_records(tmp_path / "wandb" / "wandb", run_id)
    header = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    return {u.key: json.loads(u.value_json) for u in header.config.update}


def test_a_forks_wandb_run_names_its_parents_run(tmp_path: Path) -> None:
    config = _run_config(tmp_path, "forkrun0001", {"wandb": "parentrun01", "mlflow": "abc"})
    assert config["det.parent_run_id"] == "parentrun01" and config["det.trial_id"] == 2
    assert "det.parent_run_id" not in _run_config(tmp_path, "plainrun001", {"mlflow": "abc"})
