"""The Weights & Biases client of one trial's run: its id chosen and kept before the first log, resumed with
``resume="allow"``; wandb is imported here only, when a config names it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from determined_trials.config import WandbIntegration
from determined_trials.core.store import CheckpointRecord, MetricRecord
from determined_trials.core.trackers._sink import Outcome, TrialFacts, step_values

__all__ = ["WandbSink"]


class WandbSink:
    """Logs one trial to one W&B run (``group`` = the experiment) from the forwarder's thread."""

    name = "wandb"
    rewinds = False  # a restart's repeated steps are not sent again: the run keeps the values it got first

    def __init__(self, settings: WandbIntegration, facts: TrialFacts) -> None:
        self._settings = settings
        self._facts = facts
        self._run: Any = None
        import wandb  # noqa: F401  (imported here, before training: not on the forwarder's thread)

    def create(self) -> str:
        return uuid.uuid4().hex[:16]  # W&B takes any id of lowercase letters and digits

    def resume(self, run_id: str, from_step: int) -> str | None:
        import wandb

        folder = Path(self._settings.dir or Path(self._facts.run_dir) / "wandb")
        folder.mkdir(parents=True, exist_ok=True)
        facts = self._facts
        config: dict[str, Any] = dict(facts.params)
        config.update({"det.experiment_id": facts.trial.experiment_id, "det.trial_id": facts.trial.trial_id,
                       "det.searcher_metric": facts.searcher_metric})
        if self.name in facts.parent_runs:  # a fork: its run names its parent trial's run (see docs/forking.md)
            config["det.parent_run_id"] = facts.parent_runs[self.name]
        self._run = wandb.init(
            id=run_id, resume="allow", project=self._settings.project or facts.experiment_name,
            entity=self._settings.entity, mode=self._settings.mode, dir=str(folder), name=facts.run_name,
            group=facts.experiment_name, config=config, reinit="create_new",
        )
        url = getattr(self._run, "url", None)
        return str(url) if url else None

    def log(self, rows: Sequence[MetricRecord]) -> None:
        merged: list[tuple[int, dict[str, float]]] = []
        for steps, _, values in step_values(rows):
            if merged and merged[-1][0] == steps:
                merged[-1][1].update(values)
            else:
                merged.append((steps, dict(values)))
        for steps, values in merged:
            self._run.log(values, step=steps)

    def record_checkpoint(self, checkpoint: CheckpointRecord) -> None:
        self._run.summary["det.latest_checkpoint"] = checkpoint.uuid
        self._run.summary["det.latest_checkpoint_steps"] = checkpoint.steps_completed

    def record_deleted(self, checkpoint: CheckpointRecord) -> None:
        if self._run.summary.get("det.latest_checkpoint") == checkpoint.uuid:
            self._run.summary["det.latest_checkpoint_deleted"] = True

    def close(self, outcome: Outcome) -> None:
        if outcome is Outcome.PAUSED and hasattr(self._run, "mark_preempting"):
            self._run.mark_preempting()
        self._run.finish(exit_code=outcome.exit_code)
