"""``create_experiment`` and ``continue_experiment``: validate, snapshot the context directory, record
the experiment in the run folder's store and drive it with an ``ExperimentRunner``."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from determined_trials.config import ConfigWarning, ExperimentConfig, load_config
from determined_trials.core import resolve_run_dir
from determined_trials.core.storage import StorageError, storage_from_spec
from determined_trials.core.store import LocalStore, RunState, release_dead_owners
from determined_trials.core.trackers import check_trackers
from determined_trials.errors import ConfigError
from determined_trials.experiment._errors import ExperimentError
from determined_trials.experiment._fork import ForkStart, adopt_foreign, fork_plan
from determined_trials.experiment._preflight import PreflightError, check_command, check_entrypoint
from determined_trials.experiment._report import Display, TrialSummary, summarize_trials
from determined_trials.experiment._runner import ExperimentRunner
from determined_trials.experiment._snapshot import DEFAULT_MAX_CONTEXT_BYTES, snapshot_context
from determined_trials.experiment._study_warm_start import earlier_trials, tell_earlier_trials
from determined_trials.experiment._tracebacks import SOURCE_FILE
from determined_trials.experiment._warm import preflight_ahead, warm_parent_ahead, warm_spec
from determined_trials.experiment._warm_start import resolve_warm_start

__all__ = ["ExperimentError", "ExperimentResult", "continue_experiment", "create_experiment", "fork_trial",
           "parallelism", "visible_gpus"]

SearcherFactory = Callable[[ExperimentConfig], Any]
CONFIG_FILE = "config.yaml"


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    """How an experiment run ended, and its trials."""

    experiment_id: int
    state: str
    reason: str | None
    metric: str
    trials: list[TrialSummary]


def _default_searcher(config: ExperimentConfig) -> Any:
    from determined_trials.searcher import make_searcher

    return make_searcher(config)


def _absolute_storage(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative local checkpoint_storage paths made absolute (trials run in the snapshot folder)."""
    storage = raw.get("checkpoint_storage")
    if isinstance(storage, str) and "://" not in storage:
        raw["checkpoint_storage"] = str((base / Path(storage).expanduser()).resolve())
    elif isinstance(storage, dict):
        for key in ("container_path", "host_path"):
            if isinstance(storage.get(key), str):
                storage[key] = str((base / Path(storage[key]).expanduser()).resolve())
    return raw


def visible_gpus() -> list[str]:
    """The GPUs trials may use: ``$CUDA_VISIBLE_DEVICES`` when set, else every /dev/nvidiaN."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    found = (p.name[len("nvidia"):] for p in Path("/dev").glob("nvidia[0-9]*"))
    return sorted((n for n in found if n.isdigit()), key=int)


def parallelism(config: ExperimentConfig, requested: int | None) -> int:
    """Trials run at once: ``requested`` (default: ``resources.max_slots // slots_per_trial``, else 1),
    at most the searcher's ``max_concurrent_trials`` and what the machine's GPUs (else CPU cores) hold
    at ``slots_per_trial`` each."""
    per_trial = config.resources.slots_per_trial
    if requested is None and config.resources.max_slots is not None:
        requested = config.resources.max_slots // per_trial
    wanted = max(1, requested or 1)
    concurrent = config.searcher.concurrency_cap()
    if concurrent:
        wanted = min(wanted, concurrent)
    slots = len(visible_gpus()) or os.cpu_count() or 1
    return max(1, min(wanted, slots // per_trial))


def _configured_parallel(config: ExperimentConfig) -> int | None:
    """The searcher's ``max_concurrent_trials`` when the config sets it (0: as many as fit), else None.
    Read from the config as the user wrote it (a re-parsed dump marks every default as set)."""
    cap = config.searcher.concurrency_cap()
    if cap is None or "max_concurrent_trials" not in config.searcher.model_fields_set:
        return None
    return int(cap) or (len(visible_gpus()) or os.cpu_count() or 1)


def _snapshot_to_staging(context_dir: Path, run_path: Path, max_bytes: int, display: Display,
                         *, verbatim: bool = False) -> Path:
    staging = run_path / "experiments" / f".staging-{uuid.uuid4().hex}"
    try:
        if verbatim:  # a fork: its parent's snapshot as it is (it lies in the run folder, which snapshots skip)
            shutil.copytree(context_dir, staging / "model", symlinks=True)
        else:
            snapshot_context(context_dir, staging / "model", exclude=[run_path], max_bytes=max_bytes,
                             say=lambda line: display.echo(f"det-trials: {line}"))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def _place_experiment_dir(staging: Path, exp_dir: Path) -> None:
    if exp_dir.exists():  # left from a run folder whose store was removed: keep it aside
        exp_dir.rename(exp_dir.with_name(f"{exp_dir.name}.old-{int(time.time())}"))
    staging.rename(exp_dir)


def _record_model_dir(store: LocalStore, experiment_id: int, model_dir: Path) -> None:
    # The folder is named by the experiment id, known only after create_experiment.
    store.set_experiment_model_dir(experiment_id, str(model_dir))


def create_experiment(
    config: Any, context_dir: str | os.PathLike[str], *, run_dir: str | os.PathLike[str] | None = None,
    max_parallel: int | None = None, max_context_bytes: int = DEFAULT_MAX_CONTEXT_BYTES,
    display: Display | None = None, searcher_factory: SearcherFactory | None = None, ray: str | None = None,
    fork: ForkStart | None = None,
) -> ExperimentResult:
    """Validate ``config``, snapshot ``context_dir``, record the experiment and run it to its end (or
    a pause); ConfigError/ContextTooLargeError/ExperimentError say what to fix. ``ray``: run the trials
    on a Ray cluster (``auto``, ``ray://host:port``, or ``local`` for a Ray started here). ``fork``: the
    experiment's one trial continues that checkpoint (``fork_plan``; ``context_dir`` is copied as it is)."""
    parsed = load_config(config)
    if max_parallel is None:
        max_parallel = _configured_parallel(parsed)
    if parsed.entrypoint is None:
        raise ConfigError("the experiment config has no entrypoint; add e.g. `entrypoint: model_def:MyTrial` "
                          "(a PyTorchTrial) or `entrypoint: python3 train.py` (a Core API script)")
    with warm_parent_ahead(ray is None and _starts_warm(parsed)):  # imports torch while the rest is set up
        return _create(parsed, context_dir, run_dir, max_parallel, max_context_bytes, display, searcher_factory,
                       ray, fork)


def _starts_warm(config: ExperimentConfig) -> bool:
    slots = config.resources.slots_per_trial
    return config.resources.warm_processes and warm_spec(config.entrypoint, slots) is not None


def _create(
    parsed: ExperimentConfig, context_dir: str | os.PathLike[str], run_dir: str | os.PathLike[str] | None,
    max_parallel: int | None, max_context_bytes: int, display: Display | None, searcher_factory: SearcherFactory | None,
    ray: str | None, fork: ForkStart | None,
) -> ExperimentResult:
    """``create_experiment`` once the config parsed: the checks, the snapshot, the records, the run."""
    try:
        check_command(parsed.entrypoint, Path(context_dir).resolve())
    except PreflightError as exc:
        raise ExperimentError(str(exc)) from None
    with warnings.catch_warnings():  # said by the first parse already
        warnings.simplefilter("ignore", ConfigWarning)
        parsed = load_config(_absolute_storage(parsed.as_dict(), Path.cwd()))
    searcher = (searcher_factory or _default_searcher)(parsed)
    run_path = resolve_run_dir(run_dir)
    storage = storage_from_spec(parsed.checkpoint_storage, default_dir=run_path / "checkpoints")
    try:  # a missing bucket or refused credentials: before anything is recorded or started
        storage.check()
    except StorageError as exc:
        raise ExperimentError(str(exc)) from None
    check_trackers(parsed, run_path)  # a missing package or an unanswering MLflow server, before any trial
    store = LocalStore(run_path)
    warm_start = resolve_warm_start(parsed, store, storage)  # an unknown source trial or checkpoint: ConfigError
    earlier = earlier_trials(parsed, store)  # optuna's warm_start: an unknown experiment is a ConfigError
    display = display or Display(progress=False)
    if earlier is not None:  # told to the study before its first suggestion (the runner's start_fresh)
        display.echo(f"det-trials: {tell_earlier_trials(searcher, earlier)}")
    staging = _snapshot_to_staging(Path(context_dir), run_path, max_context_bytes, display, verbatim=fork is not None)
    try:
        check_entrypoint(parsed, staging / "model", run=preflight_ahead)  # in the warm parent's fork, if one
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, PreflightError):
            raise ExperimentError(str(exc)) from None
        raise
    experiment_id = store.create_experiment(
        name=parsed.name, config=parsed.as_dict(), description=parsed.description, labels=list(parsed.labels),
    )
    exp_dir = run_path / "experiments" / str(experiment_id)
    _place_experiment_dir(staging, exp_dir)
    _record_model_dir(store, experiment_id, exp_dir / "model")
    (exp_dir / SOURCE_FILE).write_text(f"{Path(context_dir).resolve()}\n")  # tracebacks name the user's files
    config_path = exp_dir / CONFIG_FILE
    config_path.write_text(yaml.safe_dump(parsed.as_dict(), sort_keys=False))
    runner = ExperimentRunner(
        store=store, experiment_id=experiment_id, config=parsed, searcher=searcher, exp_dir=exp_dir,
        model_dir=exp_dir / "model", config_path=config_path, display=display, requested_parallel=max_parallel,
        **_placement(ray, store, exp_dir / "model", config_path, parsed, max_parallel),
    )
    runner.start_fresh(warm_start, fork)
    return _result(store, experiment_id, runner.run(), parsed)


def fork_trial(
    trial_id: int | None = None, *, checkpoint: str | None = None, overrides: tuple[str, ...] = (),
    max_length: int | None = None, run_dir: str | os.PathLike[str] | None = None, display: Display | None = None,
    ray: str | None = None, config_file: str | os.PathLike[str] | None = None,
    from_run_dir: str | os.PathLike[str] | None = None,
) -> ExperimentResult:
    """``det-trials trial fork``: a new experiment whose one trial continues trial ``trial_id``'s latest
    checkpoint (or ``checkpoint``) exactly, with ``config_file`` (a YAML mapping of settings), ``overrides``
    (``KEY.PATH=VALUE``) and ``max_length`` (in the parent's unit, from the start of the lineage) applied; run as
    ``create_experiment`` runs one. ``checkpoint`` may be a checkpoint folder of another run folder (or a uuid of
    ``from_run_dir``'s): copied into this run folder first."""
    plan = fork_plan(trial_id=trial_id, checkpoint=checkpoint, overrides=overrides, max_length=max_length,
                     run_dir=run_dir, config_file=config_file, from_run_dir=from_run_dir)
    adopt_foreign(plan, run_dir)
    return create_experiment(plan.config, plan.model_dir, run_dir=run_dir, display=display, ray=ray, fork=plan.start)


def continue_experiment(
    experiment_id: int, *, run_dir: str | os.PathLike[str] | None = None, max_parallel: int | None = None,
    display: Display | None = None, searcher_factory: SearcherFactory | None = None, ray: str | None = None,
) -> ExperimentResult:
    """Resume a PAUSED experiment: every unfinished trial from its latest checkpoint, the searcher
    from its saved state (on a Ray cluster with ``ray``, as for ``create_experiment``)."""
    store = LocalStore(resolve_run_dir(run_dir), create=False)
    release_dead_owners(store)  # a runner killed with kill -9 left its experiment ACTIVE: resumable
    exp = store.experiment(experiment_id)
    if exp.state != RunState.PAUSED or exp.searcher_state is None or exp.model_dir is None:
        hint: dict[str, str] = {
            RunState.ACTIVE: "it is running; pause it with Ctrl-C or SIGTERM first",
            RunState.COMPLETED: "it has finished", RunState.ERROR: "it failed; create a new experiment",
            RunState.CANCELED: "it was killed; create a new experiment (its checkpoints are kept)"}
        raise ExperimentError(f"experiment {experiment_id} is {exp.state}, not PAUSED: "
                              f"{hint.get(exp.state, 'only a paused experiment can continue')}")
    parsed = load_config(exp.config)
    check_trackers(parsed, store.path)
    searcher = (searcher_factory or _default_searcher)(parsed)
    if max_parallel is None:  # what the experiment ran with before its pause
        max_parallel = exp.searcher_state.get("max_parallel")
    model_dir = Path(exp.model_dir)
    exp_dir = model_dir.parent
    runner = ExperimentRunner(
        store=store, experiment_id=experiment_id, config=parsed, searcher=searcher, exp_dir=exp_dir,
        model_dir=model_dir, config_path=exp_dir / CONFIG_FILE, display=display, requested_parallel=max_parallel,
        **_placement(ray, store, model_dir, exp_dir / CONFIG_FILE, parsed, max_parallel),
    )
    runner.load_state_dict(exp.searcher_state)
    return _result(store, experiment_id, runner.run(), parsed)


def _placement(ray: str | None, store: LocalStore, model_dir: Path, config_path: Path, config: ExperimentConfig,
               max_parallel: int | None) -> dict[str, Any]:
    """Where trials run: this machine's processes and GPUs, or a Ray cluster (ray imported only then)."""
    if ray is None:
        return {"max_parallel": parallelism(config, max_parallel), "gpus": visible_gpus()}
    from determined_trials.experiment.ray import ray_runner_options

    return ray_runner_options(ray, store=store, model_dir=model_dir, config_path=config_path, config=config,
                              max_parallel=max_parallel)


def _result(store: LocalStore, experiment_id: int, state: str, config: ExperimentConfig) -> ExperimentResult:
    exp = store.experiment(experiment_id)
    metric, smaller = config.searcher.metric, config.searcher.smaller_is_better
    return ExperimentResult(experiment_id, state, exp.reason, metric,
                            summarize_trials(store, experiment_id, metric, smaller))
