"""Experiment trackers against a real `mlflow server` on 127.0.0.1 (one for the module) and W&B offline: one run per
trial named and described from the trial, metric steps equal to the store's rows, the same run after a failure,
a kill -9, a pause and continue (no step twice), the chief rank only, a server away mid-run, and the errors that
come before any trial runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.helpers_experiment import SCRIPT, create
from support.helpers_paths import SUPPORT
from support.helpers_trackers import (
    Relay,
    free_port,
    mlflow_steps,
    wait_stopped,
    wandb_records,
    wandb_steps,
)

import determined_trials as det
from determined_trials.cli.main import main
from determined_trials.config import load_config
from determined_trials.core import LocalStore
from determined_trials.core.trackers import check_trackers
from determined_trials.errors import ConfigError
from determined_trials.testing import run_ranks

pytestmark = [pytest.mark.timeout(300)]


def _config(name: str, integrations: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"name": name, "searcher": {"name": "single", "metric": "loss", "max_length": 6},
            "hyperparameters": {"net": {"width": 4, "act": "relu"}, "lr": 0.1},
            "reproducibility": {"experiment_seed": 3}, "integrations": integrations, **top}


def _report(ctx: det.core.Context, steps: range, ckpt_every: int = 2) -> None:
    for step in steps:
        ctx.train.report_training_metrics(step, {"loss": 1.0 / step, "note": "text is not a metric"})
        if step % ckpt_every == 0:
            ctx.train.report_validation_metrics(step, {"loss": 2.0 / step})
            with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
                (path / "state.json").write_text(json.dumps({"step": step}))


def _store_steps(store: LocalStore, trial_id: int, group: str) -> list[tuple[int, float]]:
    return [(m.steps_completed, float(m.metrics["loss"])) for m in store.metrics(trial_id, group)]


def _run(uri: str, run_id: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri).get_run(run_id)


def test_a_trial_is_one_run_named_and_described_from_the_trial(server: str, tmp_path: Path) -> None:
    integrations = {"mlflow": {"tracking_uri": server, "experiment_name": "trackers-names", "log_checkpoints": True},
                    "wandb": {"project": "p", "mode": "offline"}}
    with det.core.init(config=_config("names", integrations), run_dir=tmp_path) as ctx:
        _report(ctx, range(1, 5))
        trial_id = ctx.info.trial.trial_id
    store = LocalStore(tmp_path)
    runs = store.tracker_runs(trial_id)
    run = _run(server, runs["mlflow"]["run_id"])
    assert run.info.run_name == "names trial 1" and run.info.status == "FINISHED"
    assert {k: run.data.tags[k] for k in ("det.experiment_id", "det.trial_id", "det.searcher_metric")} == \
        {"det.experiment_id": "1", "det.trial_id": "1", "det.searcher_metric": "loss"}
    assert run.data.params == {"net.width": "4", "net.act": "relu", "lr": "0.1", "seed": str(store.trial(1).seed)}
    assert mlflow_steps(server, run.info.run_id, "training/loss") == _store_steps(store, trial_id, "training")
    assert mlflow_steps(server, run.info.run_id, "validation/loss") == _store_steps(store, trial_id, "validation")
    assert "training/note" not in run.data.metrics
    latest = store.latest_checkpoint(trial_id)
    assert latest is not None and run.data.tags["det.latest_checkpoint"] == latest.uuid
    assert run.data.tags["det.checkpoint.2"] == store.checkpoints(trial_id=trial_id)[0].uuid
    assert runs["mlflow"]["url"] == f"{server}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    from mlflow.tracking import MlflowClient

    artifacts = MlflowClient(tracking_uri=server).list_artifacts(run.info.run_id, f"checkpoints/{latest.uuid}")
    assert "state.json" in [Path(a.path).name for a in artifacts]

    records = wandb_records(tmp_path / "wandb" / "wandb", runs["wandb"]["run_id"])
    header = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    config = {u.key: json.loads(u.value_json) for u in header.config.update}
    assert (header.display_name, header.run_group, header.project) == ("names trial 1", "names", "p")
    assert config["net.width"] == "4" and config["det.trial_id"] == 1
    assert wandb_steps(records, "training/loss") == _store_steps(store, trial_id, "training")
    assert wandb_steps(records, "validation/loss") == _store_steps(store, trial_id, "validation")
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [0]


def test_a_resumed_trial_continues_the_same_runs_with_no_step_twice(server: str, tmp_path: Path) -> None:
    """A plain script fails after its checkpoint at step 2 (step 3 reported and sent); a new process resumes
    from "latest" and reports step 3 again: the same runs, steps 1..6 once each, FAILED then FINISHED."""
    integrations = {"mlflow": {"tracking_uri": server}, "wandb": {"mode": "offline"}}
    config = _config("resumed", integrations)
    with pytest.raises(RuntimeError, match="lost"), det.core.init(config=config, run_dir=tmp_path) as ctx:
        _report(ctx, range(1, 4))
        raise RuntimeError("lost after step 3")
    store = LocalStore(tmp_path)
    first = store.tracker_runs(1)
    assert _run(server, first["mlflow"]["run_id"]).info.status == "FAILED"
    assert mlflow_steps(server, first["mlflow"]["run_id"], "training/loss") == [(1, 1.0), (2, 0.5), (3, 1 / 3)]

    with det.core.init(config=config, run_dir=tmp_path, latest_checkpoint="latest") as ctx:
        assert ctx.info.trial.trial_id == 1
        _report(ctx, range(3, 7))
    assert store.tracker_runs(1).keys() == first.keys()
    assert {k: v["run_id"] for k, v in store.tracker_runs(1).items()} == {k: v["run_id"] for k, v in first.items()}
    run_id = first["mlflow"]["run_id"]
    assert _run(server, run_id).info.status == "FINISHED"
    expected = [(s, 1.0 / s) for s in range(1, 7)]
    assert _store_steps(store, 1, "training") == expected
    assert mlflow_steps(server, run_id, "training/loss") == expected
    records = wandb_records(tmp_path / "wandb" / "wandb", first["wandb"]["run_id"])
    assert wandb_steps(records, "training/loss") == expected
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [1, 0]
    uuids = [c.uuid for c in store.checkpoints(trial_id=1)]  # steps 2, 4, 6: each recorded once, 2 not again
    assert [store.tracker_runs(1)[name]["checkpoints"] for name in ("mlflow", "wandb")] == [uuids, uuids]
    assert [json.loads(u.value_json) for r in records if r.WhichOneof("record_type") == "summary"
            for u in r.summary.update if u.key == "det.latest_checkpoint"] == uuids


@pytest.mark.usefixtures("cpu_device")
def test_trainer_fit_logs_to_the_default_local_store(tmp_path: Path) -> None:
    """``pytorch.init(exp_conf=...)`` + ``Trainer.fit`` with ``mlflow: {}``: MLflow's SQLite store in the run folder."""
    from trials_pytorch import LinearTrial
    from trials_pytorch import config as trial_config

    from determined_trials import pytorch

    conf = trial_config(name="fit", integrations={"mlflow": {}})
    with pytorch.init(exp_conf=conf, run_dir=tmp_path) as context:
        pytorch.Trainer(LinearTrial(context), context).fit(
            max_length=pytorch.Batch(8), reporting_period=pytorch.Batch(2), validation_period=pytorch.Batch(4),
            checkpoint_period=pytorch.Batch(2), checkpoint_policy="all", show_progress=False)
    store = LocalStore(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    run_id = store.tracker_run(1, "mlflow")["run_id"]
    run = _run(uri, run_id)
    assert run.info.status == "FINISHED"
    assert "training/loss" in run.data.metrics and not [  # the loop's counters: the step is the batch count
        key for key in run.data.metrics if key.endswith(("/batches", "/epochs"))], run.data.metrics
    assert store.metrics(1, "training")[0].metrics["batches"] == 2  # still in the store's reports
    # checkpoints at 2, 4, 6, 8; retention (the latest and the best) deleted some: their tags say so
    states = {c.steps_completed: (c.uuid, c.state) for c in store.checkpoints(trial_id=1, include_deleted=True)}
    assert sorted(states) == [2, 4, 6, 8] and {state for _, state in states.values()} == {"COMPLETED", "DELETED"}
    assert {key: value for key, value in run.data.tags.items() if key.startswith("det.checkpoint.")} == {
        f"det.checkpoint.{steps}": uuid + (" (deleted)" if state == "DELETED" else "")
        for steps, (uuid, state) in states.items()}
    for group, key in (("training", "loss"), ("validation", "validation_loss")):
        rows = [(m.steps_completed, float(m.metrics[key])) for m in store.metrics(1, group)]
        assert len(rows) == (4 if group == "training" else 2)
        assert mlflow_steps(uri, run_id, f"{group}/{key}") == rows


# the first process: a plain fit preempted by SIGTERM during batch 4 (checkpointed after it), trial 1
_PREEMPTED_FIT = """
import os, signal, sys
from trials_pytorch import LinearTrial, config, fit
from determined_trials.pytorch import Batch

class Preempted(LinearTrial):
    def train_batch(self, batch, epoch_idx, batch_idx):
        if batch_idx == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().train_batch(batch, epoch_idx, batch_idx)

conf = config(name="sigterm-fit", integrations={"mlflow": {"tracking_uri": sys.argv[2]}})
_, trainer, _ = fit(Preempted, conf, sys.argv[1], max_length=Batch(8), reporting_period=Batch(1))
assert trainer.exit_reason.value == "preempted", trainer.exit_reason
"""


@pytest.mark.usefixtures("cpu_device")
def test_a_plain_fit_resumed_in_a_new_process_reports_to_its_trials_run(server: str, tmp_path: Path) -> None:
    """``pytorch.init`` then ``fit(latest_checkpoint="latest")`` after a SIGTERM stopped the first process: trial 1
    goes on, and so does its MLflow run (every step once, FINISHED); no run is opened for the trial the second
    process registered and gave up for trial 1 (issue 41)."""
    from mlflow.tracking import MlflowClient
    from trials_pytorch import LinearTrial, fit
    from trials_pytorch import config as trial_config

    from determined_trials.pytorch import Batch

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.run([sys.executable, "-c", _PREEMPTED_FIT, str(tmp_path), server], env=env,
                           capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stderr
    store = LocalStore(tmp_path)
    run_id = store.tracker_run(1, "mlflow")["run_id"]
    assert _run(server, run_id).info.status == "SCHEDULED"  # preempted: to be continued
    assert [m.steps_completed for m in store.metrics(1, "training")] == [1, 2, 3, 4]

    conf = trial_config(name="sigterm-fit", integrations={"mlflow": {"tracking_uri": server}})
    _, trainer, info = fit(LinearTrial, conf, tmp_path, latest_checkpoint="latest", max_length=Batch(8),
                           reporting_period=Batch(1))
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    assert info["trial_id"] == 1
    assert [e.id for e in store.experiments()] == [1]
    assert store.tracker_run(1, "mlflow")["run_id"] == run_id
    rows = _store_steps(store, 1, "training")
    assert [step for step, _ in rows] == list(range(1, 9))
    assert mlflow_steps(server, run_id, "training/loss") == rows
    experiment = MlflowClient(tracking_uri=server).get_experiment_by_name("sigterm-fit")
    runs = MlflowClient(tracking_uri=server).search_runs([experiment.experiment_id])
    assert [(r.info.run_id, r.info.run_name, r.info.status) for r in runs] == [(run_id, "sigterm-fit trial 1",
                                                                                  "FINISHED")]


def test_a_server_away_mid_run_neither_stalls_training_nor_loses_rows(
        server: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The helper process's warnings reach the trial's stderr (the helper inherits it)."""
    said = ""
    relay = Relay(server)
    try:
        config = _config("away", {"mlflow": {"tracking_uri": relay.uri}})
        with det.core.init(config=config, run_dir=tmp_path) as ctx:
            started = time.monotonic()
            _report(ctx, range(1, 3))
            answered = time.monotonic() - started  # two steps with the server there: this run's pace
            relay.cut()
            try:
                started = time.monotonic()
                _report(ctx, range(3, 9))  # reports and checkpoints while nobody answers
                assert time.monotonic() - started < 10 + 3 * answered
                deadline = time.monotonic() + 120
                while "did not take" not in said:
                    said += capfd.readouterr().err
                    assert time.monotonic() < deadline, "no warning while the server was away"
                    time.sleep(0.05)
            finally:  # back before the trial ends, so a failed assertion does not also wait for the last sends
                relay.restore()
    finally:
        relay.close()
    store = LocalStore(tmp_path)
    run_id = store.tracker_run(1, "mlflow")["run_id"]
    assert mlflow_steps(server, run_id, "training/loss") == _store_steps(store, 1, "training")
    assert len(_store_steps(store, 1, "training")) == 8
    assert _run(server, run_id).info.status == "FINISHED"
    assert (said + capfd.readouterr().err).count("did not take") == 1


def _two_ranks(dist: Any, run_dir: str, uri: str) -> int:
    with det.core.init(distributed=dist, config=_config("ranks", {"mlflow": {"tracking_uri": uri}}),
                       run_dir=run_dir) as ctx:
        if dist.get_rank() == 0:
            _report(ctx, range(1, 5))
        return ctx.info.trial.trial_id


@pytest.mark.slow
def test_with_two_ranks_only_the_chief_logs(server: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    assert run_ranks(_two_ranks, 2, args=(str(tmp_path), server), timeout=180) == [1, 1]
    client = MlflowClient(tracking_uri=server)
    experiment = client.get_experiment_by_name("ranks")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [LocalStore(tmp_path).tracker_run(1, "mlflow")["run_id"]]
    assert mlflow_steps(server, runs[0].info.run_id, "training/loss") == [(s, 1.0 / s) for s in range(1, 5)]


@pytest.mark.slow
def test_an_experiment_keeps_one_run_through_a_kill_9_and_a_pause(server: str, tmp_path: Path) -> None:
    ctx_dir, pids = tmp_path / "ctx", tmp_path / "pids"
    ctx_dir.mkdir()
    pids.mkdir()
    shutil.copy(SCRIPT, ctx_dir / "core_script.py")
    shutil.copy(SUPPORT / "trials_tracker_script.py", ctx_dir / "trial.py")
    config = tmp_path / "exp.yaml"
    config.write_text(json.dumps({
        "name": "killed", "entrypoint": "python3 trial.py", "max_restarts": 2,
        "hyperparameters": {"lr": 0.3, "target": 1.0, "sleep": 0.2, "ckpt_every": 2},
        "searcher": {"name": "single", "metric": "loss", "max_length": 14},
        "integrations": {"mlflow": {"tracking_uri": server}}}))
    run_dir = tmp_path / "runs"
    env = {**os.environ, "TRACKER_TEST_PIDS": str(pids)}
    from support.helpers_experiment import start_runner

    proc = start_runner(run_dir, config, ctx_dir, tmp_path / "create.out", env=env)
    try:
        store = LocalStore(run_dir)
        deadline = time.monotonic() + 120
        while len(store.metrics(1, "training")) < 3:  # step 3 reported after the checkpoint at step 2
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "create.out").read_text()
            time.sleep(0.02)
        (first,) = list(pids.iterdir())
        os.kill(int(first.name), signal.SIGSTOP)  # frozen, then killed: what it stored after its checkpoint is lost
        wait_stopped(int(first.name))  # kill() returns before the stop takes: it may still store a checkpoint
        first_rows = store.metrics(1, "training")
        # a checkpoint published but not yet recorded when it froze is recorded by the restart, which resumes from it
        first_checkpoints = {c.uuid for c in store.checkpoints(trial_id=1)} | set(store.pending_checkpoints(1))
        assert first_checkpoints
        os.kill(int(first.name), signal.SIGKILL)
        while len(list(pids.iterdir())) < 2 or len(store.metrics(1, "training")) < 8:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "create.out").read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # pause the experiment
        assert proc.wait(timeout=120) == 75, (tmp_path / "create.out").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    run_id = store.tracker_run(1, "mlflow")["run_id"]
    assert _run(server, run_id).info.status == "SCHEDULED"  # paused: to be continued
    assert main(["--run-dir", str(run_dir), "experiment", "continue", "1", "--no-progress"]) == 0
    assert store.tracker_run(1, "mlflow")["run_id"] == run_id
    assert _run(server, run_id).info.status == "FINISHED"
    rows = [(m.steps_completed, float(m.metrics["w"])) for m in store.metrics(1, "training")]
    assert [s for s, _ in rows] == list(range(1, 15))
    resumed_from = max(c.steps_completed for c in store.checkpoints(trial_id=1, include_deleted=True)
                       if c.uuid in first_checkpoints)
    lost = [m.id for m in first_rows if m.steps_completed > resumed_from]
    every_row = store.metrics(1, "training", include_superseded=True)  # what the restart took back: kept for audit
    assert [m.id for m in every_row if m.superseded_time is not None] == lost
    assert len(every_row) == 14 + len(lost)
    assert mlflow_steps(server, run_id, "training/w") == rows


@pytest.mark.slow
def test_a_trial_the_runner_gives_up_on_ends_failed_with_every_report(server: str, tmp_path: Path) -> None:
    """No restart left: the runner sends what the trial reported after its last checkpoint (step 3), then FAILED."""
    (tmp_path / "ctx").mkdir()
    shutil.copy(SCRIPT, tmp_path / "ctx" / "trial.py")
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps({
        "name": "gave-up", "entrypoint": "python3 trial.py", "max_restarts": 0,
        "hyperparameters": {"lr": 0.3, "target": 1.0, "ckpt_every": 2, "crash_at": 4, "crash_dir": str(tmp_path)},
        "searcher": {"name": "single", "metric": "loss", "max_length": 6},
        "integrations": {"mlflow": {"tracking_uri": server}}}))
    assert create(tmp_path / "runs", path, tmp_path / "ctx") != 0
    store = LocalStore(tmp_path / "runs")
    assert store.trial(1).state == "ERROR"
    run_id = store.tracker_run(1, "mlflow")["run_id"]
    rows = [(m.steps_completed, float(m.metrics["w"])) for m in store.metrics(1, "training")]
    assert [s for s, _ in rows] == [1, 2, 3]
    assert mlflow_steps(server, run_id, "training/w") == rows
    assert _run(server, run_id).info.status == "FAILED"


def test_errors_before_any_trial_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    config = _config("errors", {"mlflow": {"tracking_uri": nobody}})
    with pytest.raises(ConfigError, match=f"MLflow tracking server at {nobody} does not answer"):
        det.core.init(config=config, run_dir=tmp_path / "a")
    assert not (tmp_path / "a" / "store.sqlite").exists()
    (tmp_path / "ctx").mkdir()
    shutil.copy(SCRIPT, tmp_path / "ctx" / "trial.py")
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps({**config, "entrypoint": "python3 trial.py"}))
    assert create(tmp_path / "b", path, tmp_path / "ctx") != 0
    assert not (tmp_path / "b" / "store.sqlite").exists()
    for package in ("mlflow", "wandb"):
        monkeypatch.setitem(sys.modules, package, None)  # as if it were not installed
        with pytest.raises(ConfigError, match=rf"pip install determined-trials\[{package}\]"):
            check_trackers(load_config(_config("errors", {package: {}})), tmp_path)
