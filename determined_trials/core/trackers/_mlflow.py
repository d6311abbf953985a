"""The MLflow client of one trial's run: created once, resumed by run id, metrics by ``log_batch``; mlflow is
imported here only, when a config names it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from determined_trials.config import MlflowIntegration
from determined_trials.core.store import CheckpointRecord, MetricRecord
from determined_trials.core.trackers._sink import Outcome, TrialFacts, step_values

__all__ = ["MlflowSink", "run_url"]

_METRICS_PER_BATCH = 1000  # MLflow's limits on one log_batch call
_PARAMS_PER_BATCH = 100
_TAG_PREFIX = "det."
DELETED_MARK = "(deleted)"
"""Appended to a ``det.checkpoint.<steps>`` tag's uuid once retention deleted that checkpoint."""
_LOCAL = "directory "  # how the store names a local checkpoint folder (artifacts are sent from local storage)


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The run's page on an MLflow server (none for a local store)."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


class MlflowSink:
    """Logs one trial to one MLflow run through ``MlflowClient`` (no global fluent state is touched)."""

    name = "mlflow"
    rewinds = False  # MLflow cannot delete points: a restart's repeated steps are not sent again

    def __init__(self, settings: MlflowIntegration, facts: TrialFacts, tracking_uri: str) -> None:
        self._settings = settings
        self._facts = facts
        self._uri = tracking_uri
        from mlflow.tracking import MlflowClient  # imported here, before training: not on the forwarder's thread

        self._client_: Any = MlflowClient(tracking_uri=tracking_uri)  # no request is made until it is used
        self._run_id = ""
        self._recorded: set[str] = set()  # uuids of the checkpoints the run has

    def _client(self) -> Any:
        return self._client_

    def create(self) -> str:
        client = self._client()
        name = self._settings.experiment_name or self._facts.experiment_name
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = client.create_experiment(name)
            except Exception:  # another trial created it first
                found = client.get_experiment_by_name(name)
                if found is None:
                    raise
                experiment_id = found.experiment_id
        facts = self._facts
        tags = {"det.experiment_id": str(facts.trial.experiment_id), "det.trial_id": str(facts.trial.trial_id),
                "det.searcher_metric": facts.searcher_metric or ""}
        if self.name in facts.parent_runs:  # a fork: MLflow shows the run under its parent's
            tags["mlflow.parentRunId"] = facts.parent_runs[self.name]
        run = client.create_run(experiment_id, run_name=facts.run_name, tags=tags)
        return str(run.info.run_id)

    def resume(self, run_id: str, from_step: int) -> str | None:
        from mlflow.entities import Param

        client = self._client()
        run = client.get_run(run_id)
        if run.info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
        params = [Param(k, v) for k, v in self._facts.params.items()
                  if run.data.params.get(k) is None]
        for start in range(0, len(params), _PARAMS_PER_BATCH):
            client.log_batch(run_id, params=params[start:start + _PARAMS_PER_BATCH])
        self._run_id = run_id
        self._recorded = {v.split()[0] for k, v in run.data.tags.items() if k.startswith(f"{_TAG_PREFIX}checkpoint.")}
        return run_url(self._uri, run.info.experiment_id, run_id)

    def attach(self, run_id: str) -> None:
        """Use run ``run_id`` as it stands (its status and params untouched): for marks after its trial ended."""
        self._run_id = run_id

    def log(self, rows: Sequence[MetricRecord]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(key, value, int(when * 1000), steps)
                   for steps, when, values in step_values(rows) for key, value in values.items()]
        for start in range(0, len(metrics), _METRICS_PER_BATCH):
            self._client().log_batch(self._run_id, metrics=metrics[start:start + _METRICS_PER_BATCH])

    def record_checkpoint(self, checkpoint: CheckpointRecord) -> None:
        if checkpoint.uuid in self._recorded:  # an earlier attempt recorded it (and sent its files)
            return
        client = self._client()
        if self._settings.log_checkpoints:  # the files first: the tag says the run has the checkpoint
            folder = Path(checkpoint.storage.removeprefix(_LOCAL)) / checkpoint.uuid
            if checkpoint.storage.startswith(_LOCAL) and folder.is_dir():
                client.log_artifacts(self._run_id, str(folder), artifact_path=f"checkpoints/{checkpoint.uuid}")
        from mlflow.entities import RunTag

        client.log_batch(self._run_id, tags=[  # both tags in one request: each request costs the client CPU
            RunTag(f"{_TAG_PREFIX}checkpoint.{checkpoint.steps_completed}", checkpoint.uuid),
            RunTag(f"{_TAG_PREFIX}latest_checkpoint", checkpoint.uuid)])
        self._recorded.add(checkpoint.uuid)

    def record_deleted(self, checkpoint: CheckpointRecord) -> None:
        """The checkpoint's tag keeps its uuid, marked: a run never points at files that are gone unsaid."""
        self._client().set_tag(self._run_id, f"{_TAG_PREFIX}checkpoint.{checkpoint.steps_completed}",
                               f"{checkpoint.uuid} {DELETED_MARK}")

    def close(self, outcome: Outcome) -> None:
        self._client().set_terminated(self._run_id, status=outcome.mlflow_status)
