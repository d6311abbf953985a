"""Determined's warm start through `det-trials experiment create`: with ``searcher.source_trial_id`` or
``source_checkpoint_uuid`` every trial starts from that checkpoint's model weights (its first batch sees them
exactly) with fresh counters, data position, optimizer and LR schedule, and `experiment describe` says where
they started; a model that does not fit fails before
any training, naming the first mismatched key; an unknown trial or checkpoint is a ConfigError at create."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from support.helpers_experiment import create
from support.helpers_paths import SUPPORT
from trials_warm_start import FIRST_BATCH

from determined_trials.cli.main import main
from determined_trials.core import LocalStore
from determined_trials.errors import ConfigError
from determined_trials.experiment import create_experiment

pytestmark = pytest.mark.slow


def _context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir(exist_ok=True)
    shutil.copy(SUPPORT / "trials_warm_start.py", ctx / "model_def.py")
    return ctx


def _config(tmp_path: Path, name: str, searcher: dict[str, Any], **hparams: Any) -> Path:
    config = {
        "name": name, "entrypoint": "model_def:WarmTrial", "max_restarts": 1,
        "hyperparameters": {"global_batch_size": 4, "lr": 0.01, "hidden": 3, **hparams},
        "searcher": {"name": "single", "metric": "validation_loss", **searcher},
        "min_validation_period": {"batches": 2}, "scheduling_unit": 1,
        "reproducibility": {"experiment_seed": 11},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _first_batch(run_dir: Path, experiment_id: int, trial_id: int) -> dict[str, Any]:
    log = (run_dir / "experiments" / str(experiment_id) / f"trial_{trial_id}.log").read_text()
    return json.loads(next(line for line in log.splitlines() if FIRST_BATCH in line).split(FIRST_BATCH, 1)[1])


def _saved_weights(run_dir: Path, uuid: str) -> dict[str, list[float]]:
    state = torch.load(run_dir / "checkpoints" / uuid / "state_dict.pth", map_location="cpu", weights_only=True)
    return {k: v.reshape(-1).tolist() for k, v in state["models_state_dict"][0].items()}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A run folder whose experiment 1, trial 1, trained 5 batches: (run dir, context, its latest checkpoint)."""
    tmp_path = tmp_path_factory.mktemp("warm")
    run_dir, ctx = tmp_path / "runs", _context(tmp_path)
    assert create(run_dir, _config(tmp_path, "source", {"max_length": {"batches": 5}}), ctx) == 0
    store = LocalStore(run_dir)
    latest = store.latest_checkpoint(1)
    assert latest is not None and latest.steps_completed == 5
    return run_dir, ctx, latest.uuid


@pytest.mark.parametrize("key", ["source_trial_id", "source_checkpoint_uuid"])
def test_every_trial_starts_from_the_source_weights_with_fresh_counters(
        source: tuple[Path, Path, str], tmp_path: Path, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, ctx, uuid = source
    searcher = {"name": "random", "max_trials": 2, "max_length": {"batches": 3},
                key: 1 if key == "source_trial_id" else uuid}
    lr = {"type": "log", "base": 10, "minval": -3, "maxval": -1}
    assert create(run_dir, _config(tmp_path, f"warm-{key}", searcher, lr=lr), ctx) == 0
    store = LocalStore(run_dir)
    experiment = store.experiments()[-1]
    assert experiment.state == "COMPLETED"
    source_weights, source_first = _saved_weights(run_dir, uuid), _first_batch(run_dir, 1, 1)
    trials = store.trials(experiment.id)
    assert len(trials) == 2
    for trial in trials:
        first = _first_batch(run_dir, experiment.id, trial.id)
        assert first["weights"] == source_weights != source_first["weights"]  # exactly the source's, not its own init
        assert (first["batch_idx"], first["epoch_idx"]) == (0, 0)  # counters and data position from 0
        assert first["optimizer_state"] == 0 and first["lr"] == pytest.approx(trial.hparams["lr"])  # fresh optimizer
        assert [m.steps_completed for m in store.metrics(trial.id, "training")][0] == 1
        assert store.latest_checkpoint(trial.id).steps_completed == 3  # max_length from 0, not from the source's 5
    capsys.readouterr()
    assert main(["--run-dir", str(run_dir), "experiment", "describe", str(experiment.id)]) == 0
    assert re.search(rf"\n  warm start: +every trial from the model weights of checkpoint {uuid} \(trial 1\)\n",
                     capsys.readouterr().out)


def test_a_source_model_that_does_not_fit_fails_before_training_naming_the_key(
        source: tuple[Path, Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, ctx, uuid = source
    config = _config(tmp_path, "misfit", {"max_length": {"batches": 3}, "source_checkpoint_uuid": uuid}, hidden=5)
    assert create(run_dir, config, ctx) != 0
    out = capsys.readouterr()
    store = LocalStore(run_dir)
    experiment = store.experiments()[-1]
    assert experiment.state == "ERROR"
    trial = store.trials(experiment.id)[0]
    assert store.metrics(trial.id, "training") == [] and store.latest_checkpoint(trial.id) is None  # no training
    message = "first mismatched key '0.weight': shape [3, 4] in the checkpoint, [5, 4] in the trial's model"
    assert message in (trial.reason or "") + out.out + out.err
    assert FIRST_BATCH not in (run_dir / "experiments" / str(experiment.id) / f"trial_{trial.id}.log").read_text()


@pytest.mark.parametrize(("key", "value", "message"), [
    ("source_trial_id", 99, "there is no trial 99 in the run folder"),
    ("source_checkpoint_uuid", "0f1e2d3c-0000-4000-8000-000000000000", "checkpoint 0f1e2d3c-0000-4000-8000-0000"),
])
def test_an_unknown_source_is_a_config_error_at_create(source: tuple[Path, Path, str], tmp_path: Path, key: str,
                                                        value: Any, message: str) -> None:
    run_dir, ctx, _ = source
    before = len(LocalStore(run_dir).experiments())
    config = _config(tmp_path, "unknown", {"max_length": {"batches": 3}, key: value})
    with pytest.raises(ConfigError, match=message):
        create_experiment(str(config), ctx, run_dir=run_dir)
    assert len(LocalStore(run_dir).experiments()) == before  # nothing recorded, no trial started


def test_a_trial_without_checkpoints_is_a_config_error(source: tuple[Path, Path, str], tmp_path: Path) -> None:
    run_dir, ctx, _ = source
    store = LocalStore(run_dir)
    empty = store.create_trial(experiment_id=1, hparams={}, seed=1)
    config = _config(tmp_path, "empty", {"max_length": {"batches": 3}, "source_trial_id": empty})
    with pytest.raises(ConfigError, match=f"no checkpoint found for source trial {empty}"):
        create_experiment(str(config), ctx, run_dir=run_dir)
