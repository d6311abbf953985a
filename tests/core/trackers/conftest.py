"""The trackers' tests share one real `mlflow server` on 127.0.0.1 and run W&B offline and quiet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.helpers_trackers import mlflow_server


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@pytest.fixture(autouse=True)
def _quiet_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    # The forwarder's last sends at exit wait 30 s by default; a loaded test machine may need longer, and the
    # assertions read the runs right after the trial ends (subprocesses inherit this).
    monkeypatch.setenv("DET_TRACKER_FINISH_TIMEOUT", "300")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # our forwarder retries, not each request
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
