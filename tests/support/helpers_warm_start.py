"""A trial process as the experiment runner starts one of a warm-started experiment (``searcher.source_trial_id``
/ ``source_checkpoint_uuid``), in this process: a new trial of the run folder whose cluster info names the
checkpoint to start from, so that the family's ``init()`` and ``Trainer.fit`` run the warm start."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from determined_trials._info import CLUSTER_INFO_ENV, ClusterInfo, TrialInfo
from determined_trials.config import load_config
from determined_trials.core import LocalStore

__all__ = ["as_warm_started_trial"]

_SEED = 3
_files = itertools.count()


def as_warm_started_trial(monkeypatch: pytest.MonkeyPatch, run_dir: Path, config: dict[str, Any], uuid: str) -> int:
    """Record a new experiment and trial in ``run_dir`` and point ``DET_CLUSTER_INFO`` at its info, which names
    ``uuid`` as its warm start (what the runner hands a trial that has no checkpoint of its own); its trial id."""
    parsed = load_config(config).as_dict()
    store = LocalStore(run_dir)
    try:
        experiment_id = store.create_experiment(name="warm", config=parsed)
        trial_id = store.create_trial(experiment_id=experiment_id, hparams=config["hyperparameters"], seed=_SEED)
    finally:
        store.close()
    trial = TrialInfo(trial_id=trial_id, experiment_id=experiment_id, trial_seed=_SEED,
                      hparams=config["hyperparameters"], config=parsed)
    info = ClusterInfo(trial=trial, run_dir=str(run_dir), warm_start_checkpoint=uuid)
    path = info.write(run_dir / f"warm-info-{next(_files)}.json")  # a new path: get_cluster_info caches by path
    monkeypatch.setenv(CLUSTER_INFO_ENV, str(path))
    return trial_id
