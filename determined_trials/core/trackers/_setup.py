"""Trackers from the experiment config (and TensorBoard): the checks made before any trial runs (package installed,
MLflow server answering), the chief rank's forwarder of one trial, the runner's last word on a trial that ended for
good, and the marks of checkpoints deleted after a trial's process ended."""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from determined_trials._info import TrialInfo
from determined_trials.config import ExperimentConfig, Integrations
from determined_trials.core.store import CheckpointRecord, CheckpointState, LocalStore, TrialStore
from determined_trials.core.trackers._forwarder import TrackerForwarder
from determined_trials.core.trackers._sink import Outcome, Sink, TrialFacts
from determined_trials.errors import ConfigError

if TYPE_CHECKING:
    from determined_trials.core.trackers._mlflow import MlflowSink

__all__ = ["TrialFacts", "check_trackers", "fork_parent_runs", "mlflow_tracking_uri", "mark_deleted_checkpoints",
           "open_forwarder", "settle_trial_runs", "tensorboard_dir"]

logger = logging.getLogger("determined_trials.trackers")

_CHECK_TIMEOUT_S = 10.0


def mlflow_tracking_uri(integrations: Integrations, run_dir: str | os.PathLike[str]) -> str:
    """The config's URI, else ``$MLFLOW_TRACKING_URI``, else a SQLite store in the run folder."""
    assert integrations.mlflow is not None
    uri = integrations.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    folder = Path(run_dir).absolute() / "mlruns"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def check_trackers(config: ExperimentConfig, run_dir: str | os.PathLike[str]) -> None:
    """A ``ConfigError`` when a configured tracker's package is missing or its MLflow server does not answer."""
    integrations = config.integrations
    for name, settings in (("mlflow", integrations.mlflow), ("wandb", integrations.wandb)):
        if settings is not None and not _installed(name):
            raise ConfigError(f"integrations.{name} is set but the {name} package is not installed; install it with "
                              f"`pip install determined-trials[{name}]` or remove integrations.{name}")
    if integrations.mlflow is not None:
        _check_mlflow_server(mlflow_tracking_uri(integrations, run_dir))


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ValueError:  # present in sys.modules as None: an import of it would fail
        return False


def _check_mlflow_server(uri: str) -> None:
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error  # only with a server to ask: not on every import of the Core API
    import urllib.request

    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=_CHECK_TIMEOUT_S) as reply:
            if reply.status == 200:
                return
            problem = f"it answered HTTP {reply.status}"
    except (OSError, urllib.error.URLError) as exc:
        problem = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
    raise ConfigError(f"the MLflow tracking server at {uri} does not answer ({problem}); start it, or fix "
                      "integrations.mlflow.tracking_uri (or $MLFLOW_TRACKING_URI)")


def tensorboard_dir(run_dir: str | os.PathLike[str], experiment_id: int, trial_id: int) -> Path:
    """The trial's TensorBoard folder in the run folder."""
    return Path(run_dir) / "tensorboard" / f"experiment_{experiment_id}" / f"trial_{trial_id}"


def settle_trial_runs(store: LocalStore, config: ExperimentConfig, trial_id: int, outcome: Outcome, *,
                      timeout_s: float = 15.0) -> None:
    """The runner's last word on a trial that ended for good without its process saying so (restarts used up,
    experiment killed): send the reports its process had not sent (TensorBoard's too) and set each existing run's
    status."""
    if not store.tracker_runs(trial_id):
        return  # the trial never got as far as a tracker run
    forwarder = open_forwarder(store, _stored_facts(store, config, trial_id), config.integrations,
                               only_existing=True)
    if forwarder is not None:
        forwarder.finish(outcome, timeout_s)


def _stored_facts(store: LocalStore, config: ExperimentConfig, trial_id: int) -> TrialFacts:
    """What a tracker run records of trial ``trial_id``, read from the store (for the runner and the CLI)."""
    trial = store.trial(trial_id)
    info = TrialInfo(trial_id=trial.id, experiment_id=trial.experiment_id, trial_seed=trial.seed,
                     hparams=trial.hparams, config=config.as_dict())
    return TrialFacts(trial=info, experiment_name=store.experiment(trial.experiment_id).name,
                      searcher_metric=config.searcher.metric, run_dir=str(store.path),
                      tensorboard_dir=str(tensorboard_dir(store.path, trial.experiment_id, trial.id)))


def mark_deleted_checkpoints(store: LocalStore, config: ExperimentConfig, trial_ids: Iterable[int], *,
                             timeout_s: float = 15.0) -> None:
    """Mark in the MLflow runs of ``trial_ids`` (trials whose process has ended) the checkpoints deleted since their
    forwarder stopped (the runner's retention, ``experiment delete``), as the forwarder does: the run's status and
    params stay as the trial left them. W&B runs are left alone (docs/integrations.md). MLflow away or slow: one
    warning; the marks not made are made by a later call."""
    if config.integrations.mlflow is None:
        return
    due = {trial_id: gone for trial_id in trial_ids if (gone := _unmarked_deletions(store, trial_id))[1]}
    if not due:
        return
    if not _installed("mlflow"):
        logger.warning("trackers: the mlflow package is not installed: the deleted checkpoints of trial(s) %s are not "
                       "marked in their MLflow runs", ", ".join(map(str, sorted(due))))
        return
    uri = mlflow_tracking_uri(config.integrations, store.path)
    from determined_trials.core.trackers._mlflow import MlflowSink

    sinks = {trial_id: MlflowSink(config.integrations.mlflow, _stored_facts(store, config, trial_id), uri)
             for trial_id in due}
    done: list[tuple[int, str]] = []
    failed: list[Exception] = []
    try:
        _check_mlflow_server(uri)  # away: one quick answer, not the client's retries
    except ConfigError as exc:
        failed.append(exc)
    else:
        sender = threading.Thread(target=_send_marks, args=(sinks, due, done, failed), daemon=True,
                                  name="det-trackers-marks")
        sender.start()
        sender.join(timeout_s)
    for trial_id, uuid in list(done):  # the store is written from this thread only
        store.add_tracker_checkpoint(trial_id, "mlflow", f"deleted:{uuid}")
    if len(done) < sum(len(checkpoints) for _, checkpoints in due.values()):
        problem = f"{type(failed[0]).__name__}: {failed[0]}" if failed else f"no answer in {timeout_s:.0f} s"
        logger.warning("trackers: MLflow did not take the deletion marks of trial(s) %s's checkpoints (%s); their "
                       "det.checkpoint tags name them as kept until a later deletion marks them",
                       ", ".join(map(str, sorted(due))), problem)


def _unmarked_deletions(store: LocalStore, trial_id: int) -> tuple[str, list[CheckpointRecord]]:
    """The trial's MLflow run id and its deleted checkpoints the run has not marked (none without a run)."""
    run = store.tracker_run(trial_id, "mlflow")
    if run is None:
        return "", []
    marked = set(run["checkpoints"])
    return str(run["run_id"]), [c for c in store.checkpoints(trial_id=trial_id, include_deleted=True)
                                if c.state == CheckpointState.DELETED and f"deleted:{c.uuid}" not in marked]


def _send_marks(sinks: dict[int, MlflowSink], due: dict[int, tuple[str, list[CheckpointRecord]]],
                done: list[tuple[int, str]], failed: list[Exception]) -> None:
    """Tag each run's deleted checkpoints (on a daemon thread: an MLflow client that hangs holds nobody up)."""
    try:
        for trial_id, (run_id, checkpoints) in due.items():
            sinks[trial_id].attach(run_id)
            for checkpoint in checkpoints:
                sinks[trial_id].record_deleted(checkpoint)
                done.append((trial_id, checkpoint.uuid))
    except Exception as exc:  # reported once by the caller
        failed.append(exc)


def open_forwarder(store: TrialStore, facts: TrialFacts, integrations: Integrations, *, only_existing: bool = False,
                   before_pass: Callable[[], None] | None = None) -> TrackerForwarder | None:
    """The started forwarder of the trial's tracker runs (``only_existing``: of the runs it has already), or
    ``None`` when there is none to feed; ``before_pass`` runs before each look at the store."""
    sinks: list[Sink] = []
    if facts.tensorboard_dir is not None:
        from determined_trials.core.trackers._tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(Path(facts.tensorboard_dir), first_process=facts.first_process))
    if integrations.mlflow is not None:
        from determined_trials.core.trackers._mlflow import MlflowSink

        sinks.append(MlflowSink(integrations.mlflow, facts, mlflow_tracking_uri(integrations, facts.run_dir)))
    if integrations.wandb is not None:
        from determined_trials.core.trackers._wandb import WandbSink

        sinks.append(WandbSink(integrations.wandb, facts))
    if only_existing:
        sinks = [sink for sink in sinks if store.tracker_run(facts.trial.trial_id, sink.name) is not None]
    if not sinks:
        return None
    return TrackerForwarder(store, facts.trial.trial_id, sinks, before_pass=before_pass,
                            restart_step=facts.restart_step).start()


def fork_parent_runs(store: TrialStore, trial_id: int) -> dict[str, str]:
    """Tracker name -> run id of the trial that trial ``trial_id`` was forked from (``det-trials trial fork``;
    empty for other trials, PBT children included)."""
    trial = store.trial(trial_id)
    if trial.parent_trial_id is None or trial.search_round is not None:
        return {}
    runs = {name: store.tracker_run(trial.parent_trial_id, name) for name in ("mlflow", "wandb")}
    return {name: str(run["run_id"]) for name, run in runs.items() if run}
