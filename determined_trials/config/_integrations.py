"""The `integrations` section: the experiment trackers (MLflow, Weights & Biases) a trial's run is logged to."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from determined_trials.config._base import StrictModel
from determined_trials.config._det_keys import drop_unused_keys

__all__ = ["Integrations", "MlflowIntegration", "WandbIntegration"]


class MlflowIntegration(StrictModel):
    """One MLflow run per trial, continued by every restart and resume of the trial."""

    tracking_uri: str | None = Field(
        default=None, min_length=1,
        description="e.g. `http://127.0.0.1:5000` (default: `$MLFLOW_TRACKING_URI`, else "
                    "`sqlite:///<run dir>/mlruns/mlflow.db`)")
    experiment_name: str | None = Field(
        default=None, min_length=1, description="the MLflow experiment (default: the experiment's name)")
    log_checkpoints: bool = Field(
        default=False, description="true: each checkpoint's files also become run artifacts (local storage)")


class WandbIntegration(StrictModel):
    """One Weights & Biases run per trial (grouped by experiment), continued by every resume of the trial."""

    project: str | None = Field(
        default=None, min_length=1, description="the W&B project (default: the experiment's name)")
    entity: str | None = Field(default=None, min_length=1, description="the W&B team or user (default: yours)")
    mode: Literal["online", "offline", "disabled"] = Field(default="online", description="W&B's own mode")
    dir: str | None = Field(default=None, min_length=1, description="W&B's local files (default: `<run dir>/wandb`)")


class Integrations(StrictModel):
    """Experiment trackers that receive each trial's metrics, parameters and checkpoints (chief rank only)."""

    mlflow: MlflowIntegration | None = Field(default=None, description="e.g. `mlflow: {tracking_uri: http://127.0.0.1:5000}`")
    wandb: WandbIntegration | None = Field(default=None, description="e.g. `wandb: {project: digits, mode: offline}`")

    @model_validator(mode="before")
    @classmethod
    def _cluster_only(cls, data: Any) -> Any:
        return drop_unused_keys(data, "integrations", cls.model_fields, "integrations ")
