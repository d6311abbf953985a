"""`det-trials trial fork`: a new experiment whose one trial continues a checkpoint exactly. A fork with nothing
changed, and a fork of that fork, end bitwise where an uninterrupted run of the parent does (Adam, a StepLR,
shuffled data); a fork with `--set hyperparameters.lr=...` keeps the optimizer's state and the schedule and
rescales the lr (PBT's rule); `trial describe` names the parent; an unknown trial is an error. A checkpoint of
another run folder (its folder path, or its uuid with --from-run-dir) is copied in and forked bitwise too."""

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
from determined_trials.core.storage import storage_from_spec
from determined_trials.core.store import RetentionPolicy, collect_garbage

pytestmark = pytest.mark.slow


def _fork(run_dir: Path, *args: str) -> int:
    return main(["--run-dir", str(run_dir), "trial", "fork", *args, "--no-progress"])


def _config(tmp_path: Path, length: int, **top: Any) -> Path:
    config = {
        "name": "parent", "entrypoint": "model_def:WarmTrial", "max_restarts": 0,
        "hyperparameters": {"global_batch_size": 4, "lr": 0.01, "hidden": 3},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": length}},
        "min_validation_period": {"batches": 2}, "scheduling_unit": 1, "reproducibility": {"experiment_seed": 11},
        **top,
    }
    path = tmp_path / f"parent-{length}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _final_state(store: LocalStore, trial_id: int) -> dict[str, Any]:
    latest = store.latest_checkpoint(trial_id)
    assert latest is not None
    return torch.load(store.path / "checkpoints" / latest.uuid / "state_dict.pth", map_location="cpu",
                      weights_only=True)


def _first_batch(run_dir: Path, experiment_id: int, trial_id: int) -> dict[str, Any]:
    log = (run_dir / "experiments" / str(experiment_id) / f"trial_{trial_id}.log").read_text()
    return json.loads(next(line for line in log.splitlines() if FIRST_BATCH in line).split(FIRST_BATCH, 1)[1])


def _same(a: Any, b: Any) -> bool:
    """Every tensor and value equal, bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def test_a_fork_continues_its_parent_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, ctx = tmp_path / "runs", tmp_path / "ctx"
    ctx.mkdir()
    shutil.copy(SUPPORT / "trials_warm_start.py", ctx / "model_def.py")
    assert create(run_dir, _config(tmp_path, 3), ctx) == 0  # experiment 1: the parent, to batch 3
    assert create(run_dir, _config(tmp_path, 6), ctx) == 0  # experiment 2: the same run, uninterrupted to 6
    store = LocalStore(run_dir)
    parent, reference = store.trials(1)[0], store.trials(2)[0]
    assert parent.seed == reference.seed
    parent_checkpoint = store.latest_checkpoint(parent.id)
    assert parent_checkpoint is not None and parent_checkpoint.steps_completed == 3

    assert _fork(run_dir, str(parent.id), "--max-length", "5") == 0  # experiment 3: 3 -> 5
    fork = store.trials(3)[0]
    assert (fork.parent_trial_id, fork.parent_checkpoint, fork.seed) == (parent.id, parent_checkpoint.uuid, parent.seed)
    assert _first_batch(run_dir, 3, fork.id)["batch_idx"] == 3  # continued, not restarted
    fork_checkpoint = store.latest_checkpoint(fork.id)
    assert fork_checkpoint is not None and fork_checkpoint.steps_completed == 5
    assert _fork(run_dir, "--checkpoint", fork_checkpoint.uuid) != 0  # its max_length, 5: nothing to train
    assert "the fork would train nothing" in capsys.readouterr().err and len(store.experiments()) == 3
    assert _fork(run_dir, str(parent.id), "--set", "hyperparameters.global_batch_size=8", "--max-length", "6") != 0
    assert "cannot change global_batch_size" in capsys.readouterr().err and len(store.experiments()) == 3
    assert _fork(run_dir, "--checkpoint", fork_checkpoint.uuid, "--max-length", "6") == 0  # a fork of the fork, 5 -> 6
    fork_of_fork = store.trials(4)[0]
    assert fork_of_fork.parent_trial_id == fork.id
    assert _same(_final_state(store, fork_of_fork.id), _final_state(store, reference.id))  # bitwise the parent's run

    nothing = RetentionPolicy(metric="validation_loss", save_trial_best=0, save_trial_latest=0)
    storage = storage_from_spec(None, default_dir=run_dir / "checkpoints")
    assert collect_garbage(store, storage, 1, [parent.id], nothing) == []  # the fork started from its only one
    assert store.checkpoint(parent_checkpoint.uuid).state == "COMPLETED"

    capsys.readouterr()
    assert main(["--run-dir", str(run_dir), "trial", "describe", str(fork.id)]) == 0
    assert re.search(rf"\n  forked from: +trial {parent.id}, continuing its checkpoint {parent_checkpoint.uuid}\n",
                     capsys.readouterr().out)

    assert _fork(run_dir, str(parent.id), "--set", "hyperparameters.lr=0.02", "--max-length", "4") == 0
    changed = store.trials(5)[0]
    assert changed.hparams["lr"] == 0.02
    first = _first_batch(run_dir, 5, changed.id)
    assert first["optimizer_state"] == 4  # Adam's moments of the 4 parameters: the parent's
    assert first["lr"] == pytest.approx(0.02 * 0.5 ** 3)  # the schedule goes on (3 halvings) from the new base
    assert first["batch_idx"] == 3
    saved = torch.load(run_dir / "checkpoints" / parent_checkpoint.uuid / "state_dict.pth", weights_only=True)
    assert first["weights"] == {k: v.reshape(-1).tolist() for k, v in saved["models_state_dict"][0].items()}


def test_a_forks_mlflow_run_names_its_parents_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir, ctx = tmp_path / "runs", tmp_path / "ctx"
    ctx.mkdir()
    shutil.copy(SUPPORT / "trials_warm_start.py", ctx / "model_def.py")
    assert create(run_dir, _config(tmp_path, 3, integrations={"mlflow": {}}), ctx) == 0
    assert _fork(run_dir, "1", "--max-length", "4") == 0
    store = LocalStore(run_dir)
    parent_run, fork_run = (store.tracker_run(t, "mlflow")["run_id"] for t in (1, 2))
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlruns' / 'mlflow.db'}")
    assert client.get_run(fork_run).data.tags["mlflow.parentRunId"] == parent_run
    assert "mlflow.parentRunId" not in client.get_run(parent_run).data.tags


def test_forking_an_unknown_trial_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "runs"
    LocalStore(run_dir).close()
    assert _fork(run_dir, "7") != 0
    assert "7" in capsys.readouterr().err


def test_set_overrides_reach_the_config_and_bad_ones_are_errors() -> None:
    from determined_trials.errors import ConfigError
    from determined_trials.experiment._fork import _apply

    config: dict[str, Any] = {"min_validation_period": None, "hyperparameters": {"lr": 0.1}, "searcher": {}}
    _apply(config, "min_validation_period.batches=50")
    _apply(config, "hyperparameters.lr=0.02")
    _apply(config, "searcher.max_length={batches: 9}")
    assert config == {"min_validation_period": {"batches": 50}, "hyperparameters": {"lr": 0.02},
                      "searcher": {"max_length": {"batches": 9}}}
    for bad, message in (("lr", "KEY.PATH=VALUE"), ("searcher.name=grid", "searcher is `single`"),
                         ("hyperparameters.lr.x=1", "lr is not a section")):
        with pytest.raises(ConfigError, match=message):
            _apply(config, bad)


def test_a_config_file_changes_what_it_names_before_set(tmp_path: Path) -> None:
    from determined_trials.errors import ConfigError
    from determined_trials.experiment._fork import fork_plan

    run_dir = tmp_path / "runs"
    store = LocalStore(run_dir)
    exp = store.create_experiment(name="p", config={
        "searcher": {"name": "random", "metric": "loss", "max_length": {"batches": 10}},
        "hyperparameters": {"lr": 0.1, "opt": {"name": "adam", "beta": 0.9}}, "min_validation_period": None},
        model_dir=str(tmp_path))
    trial = store.create_trial(experiment_id=exp, hparams={"lr": 0.1, "opt": {"name": "adam", "beta": 0.9}}, seed=3)
    store.add_checkpoint(uuid="c-1", trial_id=trial, steps_completed=3, metadata={"steps_completed": 3},
                         resources={"x": 1}, storage="shared_fs")
    store.close()
    changes = tmp_path / "overrides.yaml"
    changes.write_text("hyperparameters: {lr: 0.3, opt: {beta: 0.5}}\nmin_validation_period: {batches: 2}\n"
                       "searcher: {max_length: {epochs: 2}}\n")
    plan = fork_plan(trial_id=trial, config_file=changes, overrides=("hyperparameters.lr=0.02",), run_dir=run_dir)
    assert plan.config["hyperparameters"] == {"lr": 0.02, "opt": {"name": "adam", "beta": 0.5}}  # --set last
    assert plan.config["min_validation_period"] == {"batches": 2}
    assert plan.config["searcher"]["max_length"] == {"epochs": 2}  # replaced whole: its unit changed
    for text, message in (("searcher: {name: grid}", "searcher is `single`"), ("- 1", "a mapping of the settings")):
        changes.write_text(text)
        with pytest.raises(ConfigError, match=message):
            fork_plan(trial_id=trial, config_file=changes, run_dir=run_dir)


def test_a_fork_of_another_run_folders_checkpoint_continues_it_exactly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other, here, ctx = tmp_path / "other", tmp_path / "here", tmp_path / "ctx"
    ctx.mkdir()
    shutil.copy(SUPPORT / "trials_warm_start.py", ctx / "model_def.py")
    assert create(other, _config(tmp_path, 3), ctx) == 0  # experiment 1 of the other folder: the parent, to 3
    assert create(other, _config(tmp_path, 5), ctx) == 0  # experiment 2: the same run, uninterrupted to 5
    (ctx / "model_def.py").write_text("raise ImportError('the fork runs the parent's snapshot')\n")
    source = LocalStore(other)
    parent, reference = source.trials(1)[0], source.trials(2)[0]
    parent_checkpoint = source.latest_checkpoint(parent.id)
    assert parent_checkpoint is not None and parent_checkpoint.steps_completed == 3
    folder = other / "checkpoints" / parent_checkpoint.uuid
    before = sorted(p.relative_to(other) for p in other.rglob("*") if "store" not in p.name)

    assert _fork(here, "--checkpoint", str(folder), "--max-length", "5") == 0  # a new run folder: 3 -> 5
    store = LocalStore(here)
    fork = store.trials(1)[0]
    assert (fork.parent_trial_id, fork.parent_checkpoint, fork.seed) == (None, parent_checkpoint.uuid, parent.seed)
    assert _first_batch(here, 1, fork.id)["batch_idx"] == 3  # continued, not restarted
    assert _same(_final_state(store, fork.id), _final_state(source, reference.id))  # bitwise the parent's run
    adopted = store.checkpoint(parent_checkpoint.uuid)  # copied in, recorded without a trial, its origin named
    assert adopted.trial_id is None and adopted.resources == parent_checkpoint.resources
    assert adopted.metadata["forked_from"] == {"run_dir": str(other), "experiment_id": 1, "trial_id": parent.id}
    assert (here / "checkpoints" / parent_checkpoint.uuid / "state_dict.pth").read_bytes() == (
        folder / "state_dict.pth").read_bytes()
    assert sorted(p.relative_to(other) for p in other.rglob("*") if "store" not in p.name) == before  # only read
    assert len(source.experiments()) == 2
    assert str(other) in store.experiment(1).name

    capsys.readouterr()
    assert main(["--run-dir", str(here), "trial", "describe", str(fork.id)]) == 0
    assert re.search(rf"\n  forked from: +trial {parent.id} \(experiment 1\) of run folder {re.escape(str(other))}, "
                     rf"continuing its checkpoint {parent_checkpoint.uuid} \(copied here\)\n", capsys.readouterr().out)
    nothing = RetentionPolicy(metric="validation_loss", save_trial_best=0, save_trial_latest=0)
    storage = storage_from_spec(None, default_dir=here / "checkpoints")
    collect_garbage(store, storage, 1, [fork.id], nothing)
    assert store.checkpoint(parent_checkpoint.uuid).state == "COMPLETED"  # the fork started from it

    # the uuid with --from-run-dir, and the bare uuid of the copy: both the other folder's checkpoint again
    from determined_trials.experiment._fork import fork_plan

    for plan in (fork_plan(checkpoint=parent_checkpoint.uuid, from_run_dir=other, run_dir=here, max_length=5),
                 fork_plan(checkpoint=parent_checkpoint.uuid, run_dir=here, max_length=4)):
        assert plan.foreign is not None and plan.foreign.run_dir == str(other)
        assert (plan.start.checkpoint, plan.start.parent_trial_id, plan.start.seed) == (
            parent_checkpoint.uuid, None, parent.seed)
        assert plan.model_dir == other / "experiments" / "1" / "model"

def test_forking_what_is_not_another_run_folders_checkpoint_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other, here = tmp_path / "other", tmp_path / "here"
    LocalStore(other).close()
    (other / "checkpoints" / "not-one").mkdir(parents=True)
    loose = tmp_path / "loose" / "abc"
    loose.mkdir(parents=True)
    (loose / "metadata.json").write_text("{}")
    for args, message in (
            ((str(other / "checkpoints" / "not-one"),), "is not a checkpoint folder: it holds no metadata.json"),
            ((str(other / "checkpoints" / "gone"),), "is not a checkpoint folder: it does not exist"),
            ((str(loose),), "no folder above it is a run folder"),
            (("abc", "--from-run-dir", str(other)), f"run folder {other} has no checkpoint abc"),
            ((str(loose), "--from-run-dir", str(other)), f"run folder {other} has no checkpoint abc"),
            (("abc", "--from-run-dir", str(tmp_path / "nowhere")), "does not exist")):
        assert _fork(here, "--checkpoint", *args) != 0
        assert message in capsys.readouterr().err
    assert not here.exists()  # nothing made
    assert _fork(here, "--from-run-dir", str(other), "1") != 0
    assert "--from-run-dir names where --checkpoint is" in capsys.readouterr().err
