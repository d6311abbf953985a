"""Trackers off the training process: the trial holds no tracker client (its helper process does) while its reports
reach MLflow within seconds; a kill -9 of a plain script leaves its helper to send what the store holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.helpers_trackers import Relay, mlflow_steps, wait_for

from determined_trials.core import LocalStore

pytestmark = [pytest.mark.timeout(300)]

# reports steps 1..3 (half a second apart), says what it holds, reports step 4 when told; ends when its stdin says so
_TRIAL = """
import json, sys, threading, time
import determined_trials as det
config = {"name": sys.argv[3], "searcher": {"name": "single", "metric": "loss", "max_length": 8},
          "hyperparameters": {"lr": 0.1}, "integrations": {"mlflow": {"tracking_uri": sys.argv[2]}}}
with det.core.init(config=config, run_dir=sys.argv[1]) as ctx:
    print(json.dumps({"event": "started"}), flush=True)
    sys.stdin.readline()  # the test is ready (e.g. it cut the server away)
    for step in range(1, 4):
        ctx.train.report_training_metrics(step, {"loss": 1.0 / step})
        time.sleep(0.5)
    ctx.train.flush_reports()
    print(json.dumps({"event": "reported", "mlflow": "mlflow" in sys.modules,
                      "threads": sorted(t.name for t in threading.enumerate())}), flush=True)
    sys.stdin.readline()  # steps 1..3 are in MLflow: the helper is warm
    ctx.train.flush_reports()
    ctx.train.report_training_metrics(4, {"loss": 0.25})  # held: the last store was just now, and no report follows
    print(json.dumps({"event": "step 4", "at": time.time()}), flush=True)
    sys.stdin.readline()
"""


def _start(tmp_path: Path, uri: str, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _TRIAL, str(tmp_path), uri, name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=os.environ.copy())


def _said(proc: subprocess.Popen[str], event: str) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"the trial ended before {event!r} (exit code {proc.wait()})"
    said = json.loads(line)
    assert said["event"] == event, said
    return dict(said)


def _tell(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def _mlflow_has(store: LocalStore, uri: str, steps: list[int]) -> bool:
    run = store.tracker_run(1, "mlflow")
    return run is not None and [s for s, _ in mlflow_steps(uri, run["run_id"], "training/loss")] == steps


def test_the_trial_process_holds_no_tracker_client_and_its_reports_reach_mlflow(server: str, tmp_path: Path) -> None:
    """The trial process never imports mlflow and runs no forwarder thread; its reports (the last of them held by
    its report buffer, which the trial's own thread stores) are in the MLflow run, a report made once the helper is
warm within 5 s; at its end the run is FINISHED and the helper gone."""
    proc = _start(tmp_path, server, "off-process")
    try:
        _said(proc, "started")
        _tell(proc)
        said = _said(proc, "reported")
        assert said["mlflow"] is False
        assert not [name for name in said["threads"] if name.startswith("det-trackers")], said["threads"]
        store = LocalStore(tmp_path)
        wait_for("steps 1..3 in MLflow", lambda: _mlflow_has(store, server, [1, 2, 3]), 60)
        _tell(proc)
        reported_at = _said(proc, "step 4")["at"]
        wait_for("step 4 in MLflow", lambda: _mlflow_has(store, server, [1, 2, 3, 4]), 60)
        waited = time.time() - reported_at
        _tell(proc)
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    assert waited <= 5.0, f"the last report reached MLflow {waited:.1f} s after it was stored"
    from mlflow.tracking import MlflowClient

    run_id = store.tracker_run(1, "mlflow")["run_id"]
    assert MlflowClient(tracking_uri=server).get_run(run_id).info.status == "FINISHED"


def test_a_kill_9_of_a_plain_script_leaves_its_helper_to_send_the_stored_reports(server: str, tmp_path: Path) -> None:
    """The server is away while the script stores steps 1..3; the script is killed (-9); once the server answers
    again its helper sends the three steps and marks the run KILLED (resumable), on its own."""
    relay = Relay(server)
    proc = _start(tmp_path, relay.uri, "killed-helper")
    try:
        _said(proc, "started")
        relay.cut()
        _tell(proc)
        _said(proc, "reported")
        store = LocalStore(tmp_path)
        assert [m.steps_completed for m in store.metrics(1, "training")] == [1, 2, 3]
        proc.kill()
        proc.wait(timeout=60)
        assert not _mlflow_has(store, server, [1, 2, 3])  # nothing could be sent while the server was away
        relay.restore()
        wait_for("steps 1..3 in MLflow after the kill", lambda: _mlflow_has(store, server, [1, 2, 3]), 120)
        from mlflow.tracking import MlflowClient

        run_id = store.tracker_run(1, "mlflow")["run_id"]
        wait_for("the run marked KILLED", lambda: MlflowClient(tracking_uri=server).get_run(
            run_id).info.status == "KILLED", 120)  # through the relay: it stays up until then
    finally:
        proc.kill()
        relay.close()


def test_a_trial_without_hyperparameters_has_the_seed_as_its_only_param() -> None:
    """No param with an empty key (MLflow refused the run's whole params batch, so no run was ever created)."""
    from determined_trials.core.trackers._sink import flat_params

    assert flat_params({}, 3) == {"seed": "3"}
    assert flat_params({"net": {"width": 4}, "opt": {}}, 3) == {"net.width": "4", "opt": "{}", "seed": "3"}
