"""What the dashboard's JSON API answers: plain dicts built from the store's reads (no writes)."""

from __future__ import annotations

import datetime as _dt
import itertools
import math
import operator
import os
import stat
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from determined_trials.core import experiment_progress, planned_trials
from determined_trials.core.store import CheckpointRecord, Experiment, LocalStore, RunState, Trial, owner_alive
from determined_trials.ui._downsample import keep_indices
from determined_trials.ui._importances import param_importances
from determined_trials.ui._lineage import experiment_origins, trial_origin

__all__ = [
    "MAX_LOG_LINES",
    "checkpoints",
    "clean",
    "experiment",
    "experiment_metric",
    "experiments",
    "log_tail",
    "trial",
    "trial_metrics",
    "trials",
]

MAX_LOG_LINES = 5000
_LOG_BLOCK = 64 * 1024
_LOG_MAX_BYTES = 8 * 1024 * 1024


def clean(value: Any) -> Any:
    """``value`` as strict JSON: NaN and infinities become ``None``, tuples lists, other objects strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    return str(value)


def _iso(value: _dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _searcher(exp: Experiment) -> dict[str, Any]:
    raw = exp.config.get("searcher")
    searcher: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return {"name": searcher.get("name"), "metric": searcher.get("metric"),
            "smaller_is_better": bool(searcher.get("smaller_is_better", True))}


def _running(store: LocalStore, exp: Experiment) -> bool:
    """Whether a live process runs the experiment (an ACTIVE one whose process died is not running)."""
    owner = store.experiment_owner(exp.id) if exp.state == RunState.ACTIVE else None
    return owner is not None and owner_alive(*owner)


def _progress(exp: Experiment, trial_list: list[Trial]) -> float | None:
    """``core._progress.experiment_progress``: over the trials the runner's searcher runs; a plain script's
    experiment runs the trials it made; a COMPLETED experiment is done."""
    if exp.state == RunState.COMPLETED:
        return 1.0
    planned = planned_trials(exp.config) if exp.model_dir else None
    return experiment_progress(((t.state, t.progress) for t in trial_list), planned)


def _best_of(values: dict[int, float], smaller: bool) -> float | None:
    if not values:
        return None
    return min(values.values()) if smaller else max(values.values())


def _experiment_dict(store: LocalStore, exp: Experiment, trial_list: list[Trial],
                     counts: dict[str, int]) -> dict[str, Any]:
    searcher = _searcher(exp)
    metric = searcher["metric"]
    best = _best_of(store.best_by_trial(exp.id, metric, searcher["smaller_is_better"]), searcher["smaller_is_better"]) \
        if metric else None
    return clean({
        "id": exp.id, "name": exp.name, "description": exp.description, "labels": list(exp.labels),
        "state": exp.state, "reason": exp.reason, "kind": "runner" if exp.model_dir else "script",
        "running": _running(store, exp),
        "searcher": searcher, "best_metric": best, "progress": _progress(exp, trial_list),
        "trial_counts": counts, "num_trials": sum(counts.values()),
        "start_time": _iso(exp.start_time), "end_time": _iso(exp.end_time),
    })


def experiments(store: LocalStore) -> list[dict[str, Any]]:
    """Every experiment with its state, progress, best searcher metric and trial counts by state."""
    by_exp: dict[int, list[Trial]] = defaultdict(list)
    for t in store.trials():
        by_exp[t.experiment_id].append(t)
    counts = store.trial_counts()
    return [_experiment_dict(store, e, by_exp[e.id], counts.get(e.id, {})) for e in store.experiments()]


def _hparam_specs(specs: Any, prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """The config's typed hyperparameters as (name, spec), nested ones named ``a.b``."""
    if isinstance(specs, dict):
        for key, spec in specs.items():
            if isinstance(spec, dict) and "type" in spec:
                yield f"{prefix}{key}", spec
            elif isinstance(spec, dict):
                yield from _hparam_specs(spec, f"{prefix}{key}.")


def _searched(spec: dict[str, Any]) -> bool:
    """Whether a hyperparameter's spec lets its value differ between trials (a range or several choices)."""
    if spec.get("type") == "categorical":
        return len(spec.get("vals") or ()) > 1
    return spec.get("type") in ("int", "double", "log") and spec.get("minval") != spec.get("maxval")


def experiment(store: LocalStore, experiment_id: int) -> dict[str, Any]:
    """One experiment, as in :func:`experiments`, plus its config, metric names per group and the names of the
    config's log-scaled hyperparameters and of those it searches (a range or several choices)."""
    exp = store.experiment(experiment_id)
    trials = store.trials(exp.id)
    out = _experiment_dict(store, exp, trials, store.trial_counts().get(exp.id, {}))
    out["config"] = clean(exp.config)
    out["origins"] = experiment_origins(store, exp, trials)  # a fork's parent trial, a warm start's checkpoint
    specs = list(_hparam_specs(exp.config.get("hyperparameters")))
    out["log_hparams"] = [name for name, spec in specs if spec.get("type") == "log"]
    out["searched_hparams"] = [name for name, spec in specs if _searched(spec)]
    out["metric_names"] = {g: store.metric_names(exp.id, g) for g in ("training", "validation")}
    out["param_importances"] = param_importances(exp)  # optuna's, from 10 completed trials on; else null
    out["time"] = store.experiment_time(exp.id, now=time.time())  # the trials' parts summed, with "goodput"
    return out


def _trial_dict(t: Trial, steps: int | None, best: float | None) -> dict[str, Any]:
    return clean({
        "id": t.id, "experiment_id": t.experiment_id, "state": t.state, "reason": t.reason, "status": t.status,
        "hparams": t.hparams, "seed": t.seed, "restarts": t.restarts, "progress": t.progress,
        "early_exit_reason": t.early_exit_reason, "batches": steps, "best_metric": best,
        "start_time": _iso(t.start_time), "end_time": _iso(t.end_time),
        "parent_trial_id": t.parent_trial_id, "parent_checkpoint": t.parent_checkpoint, "search_round": t.search_round,
    })


def trials(store: LocalStore, experiment_id: int) -> dict[str, Any]:
    """The experiment's trials: hyperparameters, state, batches trained, best searcher metric, restarts."""
    exp = store.experiment(experiment_id)
    searcher = _searcher(exp)
    best = store.best_by_trial(exp.id, searcher["metric"], searcher["smaller_is_better"]) \
        if searcher["metric"] else {}
    steps = store.trial_steps(exp.id)
    return {"experiment_id": exp.id, "searcher": searcher,
            "trials": [_trial_dict(t, steps.get(t.id), best.get(t.id)) for t in store.trials(exp.id)]}


def trial(store: LocalStore, trial_id: int) -> dict[str, Any]:
    """One trial with its experiment's name, searcher and config, the metric groups it reported and its
    tracker runs (MLflow, W&B: run id and link)."""
    t = store.trial(trial_id)
    exp = store.experiment(t.experiment_id)
    searcher = _searcher(exp)
    best = store.best_by_trial(exp.id, searcher["metric"], searcher["smaller_is_better"], trial_id=t.id).get(t.id) \
        if searcher["metric"] else None
    out = _trial_dict(t, store.trial_steps(exp.id, trial_id=t.id).get(t.id), best)
    out.update(experiment_name=exp.name, experiment_state=exp.state, searcher=searcher,
               config=clean(exp.config), metric_groups=store.metric_groups(t.id),
               trackers={name: {"run_id": run["run_id"], "url": run["url"]}  # TensorBoard's folder is not a tracker's
                         for name, run in store.tracker_runs(t.id).items() if name != "tensorboard"},
               time=store.trial_time(t.id, now=time.time()),  # where its wall time went, in seconds
               origin=trial_origin(store, t, exp))  # the trial and checkpoint it started from, or null
    return out


def _series(steps: list[int], values: list[float], max_points: int) -> dict[str, list[Any]]:
    keep = keep_indices(values, max_points)
    return {"steps": [steps[i] for i in keep], "values": [values[i] for i in keep]}


def trial_metrics(store: LocalStore, trial_id: int, group: str, max_points: int) -> dict[str, Any]:
    """Every numeric metric of one group of the trial as a series, each thinned to ``max_points``."""
    raw: dict[str, tuple[list[int], list[float]]] = {}
    for record in store.metrics(trial_id, group):
        for name, value in record.metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                steps, values = raw.setdefault(str(name), ([], []))
                steps.append(record.steps_completed)
                values.append(float(value))
    return {"trial_id": trial_id, "group": group, "max_points": max_points,
            "series": {name: _series(s, v, max_points) for name, (s, v) in sorted(raw.items())}}


def experiment_metric(store: LocalStore, experiment_id: int, group: str, metric: str,
                      max_points: int) -> dict[str, Any]:
    """One metric of one group for every trial of the experiment (learning curves), each thinned to
    ``max_points``; a trial with more reports than that is read as an even sample of them first
    (``LocalStore.metric_points``), so this overview stays quick for long runs (a trial's own charts read all)."""
    store.experiment(experiment_id)
    points = store.metric_points(experiment_id, group, metric, max_rows_per_trial=max_points)
    raw: dict[int, tuple[list[int], list[float]]] = {}
    for tid, rows in itertools.groupby(points, key=operator.itemgetter(0)):
        kept = [(steps, value) for _, steps, value in rows if math.isfinite(value)]
        if kept:
            raw[tid] = ([p[0] for p in kept], [p[1] for p in kept])
    return {"experiment_id": experiment_id, "group": group, "metric": metric, "max_points": max_points,
            "trials": {str(tid): _series(s, v, max_points) for tid, (s, v) in raw.items()}}


def _checkpoint_dict(c: CheckpointRecord) -> dict[str, Any]:
    return clean({"uuid": c.uuid, "trial_id": c.trial_id, "steps_completed": c.steps_completed, "state": c.state,
                  "size": c.size, "files": len(c.resources), "report_time": _iso(c.report_time),
                  "delete_time": _iso(c.delete_time), "metadata": c.metadata})


def checkpoints(store: LocalStore, trial_id: int) -> list[dict[str, Any]]:
    """The trial's checkpoints, deleted ones too (their state says so), in report order."""
    return [_checkpoint_dict(c) for c in store.checkpoints(trial_id=trial_id, include_deleted=True)]


def _open_log(run_dir: Path, experiment_id: int, trial_id: int) -> int | None:
    """A descriptor of the trial's log, opened from the run folder down without following any symbolic link
    (a link, e.g. to a file only root may read, or anything but a regular file is no log: None)."""
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    for name, last in (("experiments", False), (str(experiment_id), False), (f"trial_{trial_id}.log", True)):
        try:
            inner = os.open(name, nofollow | (0 if last else os.O_DIRECTORY), dir_fd=fd)
        except OSError:  # missing, a link (ELOOP, ENOTDIR) or unreadable
            inner = -1
        os.close(fd)
        if inner < 0:
            return None
        fd = inner
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    return None


def log_tail(store: LocalStore, trial_id: int, tail: int) -> dict[str, Any]:
    """The last ``tail`` lines of the trial's log (``available`` is false for a plain script's trial, and for a
    log that is a symbolic link or not a regular file: it is never followed)."""
    t = store.trial(trial_id)
    tail = max(0, min(int(tail), MAX_LOG_LINES))
    fd = _open_log(store.path, t.experiment_id, t.id)
    if fd is None:
        return {"trial_id": t.id, "available": False, "lines": []}
    with os.fdopen(fd, "rb") as log:
        end = log.seek(0, os.SEEK_END)
        start, data = end, b""
        while start > 0 and data.count(b"\n") <= tail and end - start < _LOG_MAX_BYTES:
            start = max(0, start - _LOG_BLOCK)
            log.seek(start)
            data = log.read(end - start)
    lines = data.decode("utf-8", errors="replace").splitlines()
    if start > 0 and lines:
        lines = lines[1:]  # the first line may be cut
    return {"trial_id": t.id, "available": True, "lines": lines[-tail:] if tail else []}
