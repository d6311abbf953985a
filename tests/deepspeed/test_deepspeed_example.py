"""examples/deepspeed_digits as a local experiment (`det-trials experiment create`), shortened to one slot
and 12 batches, with the legacy entrypoint ``model_def:DigitsDeepSpeedTrial`` (torch_distributed launcher,
then the --trial harness): the runner recognises a DeepSpeedTrial with no extra flag."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from support.helpers_experiment import create
from support.helpers_paths import REPO

from determined_trials.core import LocalStore

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device")]

EXAMPLE = REPO / "examples" / "deepspeed_digits"


def test_the_deepspeed_example_runs_as_an_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DET_DEEPSPEED_SHM_COMM", "0")
    model_dir = tmp_path / "model"
    shutil.copytree(EXAMPLE, model_dir)
    config = yaml.safe_load((EXAMPLE / "const.yaml").read_text())
    config.update(entrypoint="model_def:DigitsDeepSpeedTrial", resources={"slots_per_trial": 1},
                  searcher={**config["searcher"], "max_length": {"batches": 12}},
                  min_validation_period={"batches": 6}, min_checkpoint_period={"batches": 6})
    config["hyperparameters"]["global_batch_size"] = 32  # 16 per micro-batch x 2 accumulation steps x 1 slot
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(config))
    assert create(tmp_path / "run", path, model_dir) == 0
    store = LocalStore(tmp_path / "run")
    (trial,) = store.trials()
    assert trial.state == "COMPLETED"
    validations = store.metrics(trial.id, group="validation")
    assert [m.steps_completed for m in validations] == [6, 12]
    accuracy = [m.metrics["validation_accuracy"] for m in validations]
    assert accuracy[1] > max(accuracy[0], 0.2)  # learning (10 classes: chance is 0.1; LR still warming up)
    assert [c.steps_completed for c in store.checkpoints(include_deleted=True)] == [6, 12]  # 6: GC took it
