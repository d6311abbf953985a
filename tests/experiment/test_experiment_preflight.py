"""`experiment create` checks what it can before training (the entrypoint's trial class, in a short
child process; global_batch_size), spends no restarts on the same failure before a trial's first
report, and prints each failure once (per attempt, and once in the summary)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from support.helpers_experiment import create, make_context

from determined_trials.core import LocalStore
from determined_trials.experiment import ExperimentError, create_experiment
from determined_trials.experiment._preflight import check_command, trial_spec_of

TRIAL_FILE = '''
from determined_trials import pytorch

class DigitsTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
    def build_training_data_loader(self): ...
    def build_validation_data_loader(self): ...
    def train_batch(self, batch, epoch_idx, batch_idx): ...
    def evaluate_batch(self, batch): ...

class NotATrial:
    pass
'''


def _trial_context(tmp_path: Path, entrypoint: str, hparams: dict) -> tuple[dict, Path]:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "model_def.py").write_text(TRIAL_FILE)
    config = {"entrypoint": entrypoint, "hyperparameters": hparams, "max_restarts": 5,
              "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 2}}}
    return config, ctx


@pytest.mark.parametrize(("entrypoint", "message"), [
    ("model_def:DigitTrial", "has no 'DigitTrial'"),
    ("python3 -m determined_trials.launch.torch_distributed --trial model_def:NotATrial", "is not a trial class"),
    ("model_def:Nope", "the trial classes in it are: DigitsTrial"),
    ("missing_module:DigitsTrial", "no module 'missing_module'"),
])
def test_create_rejects_an_entrypoint_that_can_never_run(tmp_path: Path, entrypoint: str, message: str) -> None:
    config, ctx = _trial_context(tmp_path, entrypoint, {"global_batch_size": 4})
    with pytest.raises(ExperimentError, match=message):
        create_experiment(config, ctx, run_dir=tmp_path / "runs")
    store = LocalStore(tmp_path / "runs")
    assert store.experiments() == []  # nothing recorded, no trial started
    assert [p.name for p in (tmp_path / "runs" / "experiments").iterdir()] == []  # no staging left


@pytest.mark.parametrize(("entrypoint", "message"), [
    ("model_def.DigitsTrial", r"'model_def\.DigitsTrial' is neither a file in the context directory .* nor a "
                              r"command on PATH; to run a trial class write `model_def:DigitsTrial` \(module:Class\)"),
    ("no-such-program --flag", r"'no-such-program' is neither a file .*e\.g\. `python3 train\.py`"),
    ("python3 trian.py --epochs 2", r"has no trian\.py"),
])
def test_create_refuses_a_script_entrypoint_that_cannot_start_before_creating_anything(
    tmp_path: Path, entrypoint: str, message: str,
) -> None:
    config, ctx = _trial_context(tmp_path, entrypoint, {"global_batch_size": 4})
    with pytest.raises(ExperimentError, match=message):
        create_experiment(config, ctx, run_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()  # not even the run folder


def test_check_command_accepts_what_can_start(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "run.sh").write_text("")
    for entrypoint in ("python3 train.py --x 1", "./run.sh", "python3 -m some.module", ["python3", "train.py"],
                       "A=1 python3 train.py", "model_def:MyTrial", "sh -c 'cd x && ./go'"):
        check_command(entrypoint, tmp_path)


def test_create_rejects_a_trial_class_without_global_batch_size(tmp_path: Path) -> None:
    config, ctx = _trial_context(tmp_path, "model_def:DigitsTrial", {"lr": 0.1})
    with pytest.raises(ValueError, match="needs `global_batch_size`"):
        create_experiment(config, ctx, run_dir=tmp_path / "runs")
    assert LocalStore(tmp_path / "runs").experiments() == []


def test_trial_spec_of_entrypoints() -> None:
    assert trial_spec_of("model_def:MyTrial") == ("model_def:MyTrial", None)
    assert trial_spec_of("python3 -m determined_trials.launch.torch_distributed --context-dir src "
                         "--trial m.py:T") == ("m.py:T", "src")
    assert trial_spec_of(["python3", "-m", "x", "--trial=m:T"]) == ("m:T", None)
    assert trial_spec_of("python3 train.py --epochs 3") is None


@pytest.mark.slow
def test_the_same_failure_before_the_first_report_is_not_restarted_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    crash_dir = tmp_path / "crashes"
    crash_dir.mkdir()
    config, ctx = make_context(tmp_path, {"crash_at": 1, "crash_times": 99, "crash_dir": str(crash_dir)},
                               max_restarts=5)
    started = time.monotonic()
    assert create(tmp_path / "runs", config, ctx) == 1
    assert time.monotonic() - started < 120
    trial = LocalStore(tmp_path / "runs").trial(1)
    assert trial.state == "ERROR" and trial.restarts == 1  # two attempts, not six
    assert (crash_dir / "crashes_1").read_text() == "2"
    out = capsys.readouterr()
    text = out.out + out.err
    assert "failed again the same way before its first report" in text
    # the first attempt's traceback; the second, the same, is one line; the summary names the error in one line
    assert text.count("Traceback (most recent call last") == 1, text
    assert "RuntimeError: boom at step 1  (the same traceback as before; every line is in trial_1.log)" in text
    reason = LocalStore(tmp_path / "runs").experiment(1).reason or ""
    assert "RuntimeError: boom at step 1" in reason and "\n" not in reason


def test_a_config_file_with_a_missing_class_fails_fast_through_the_cli(tmp_path: Path) -> None:
    config, ctx = _trial_context(tmp_path, "model_def:Missing", {"global_batch_size": 4})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert create(tmp_path / "runs", path, ctx) == 2


FAILING_TRIAL_FILE = '''
import torch
from determined_trials import pytorch

class FailingTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(2, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))
    def _data(self, n):
        return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.zeros(n, 2), torch.zeros(n, 1)),
                                  batch_size=self.context.get_per_slot_batch_size())
    def build_training_data_loader(self):
        return self._data(32)
    def build_validation_data_loader(self):
        return self._data(8)
    def train_batch(self, batch, epoch_idx, batch_idx):
        raise ValueError("bad batch number " + str(batch_idx))
    def evaluate_batch(self, batch):
        return {"validation_loss": 0.0}
'''


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_device")
def test_a_trial_failing_in_train_batch_shows_its_exception_once_per_attempt_and_once_in_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "model_def.py").write_text(FAILING_TRIAL_FILE)
    config = {"entrypoint": "model_def:FailingTrial", "hyperparameters": {"global_batch_size": 4},
              "max_restarts": 1, "searcher": {"name": "single", "metric": "validation_loss",
                                              "max_length": {"batches": 2}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert create(tmp_path / "runs", path, ctx) == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert LocalStore(tmp_path / "runs").trial(1).restarts == 1, text  # two attempts
    # The traceback once (the restart that fails the same way says so in one line), with the user's frames
    # under the user's own path, not the snapshot's, and none of the harness's.
    assert text.count("Traceback (most recent call last") == 1, text
    assert f'File "{ctx / "model_def.py"}", line' in text, text
    assert "experiments/1/model/model_def.py" not in text and "determined_trials/" not in text, text
    assert "(the same traceback as before; every line is in trial_1.log)" in text, text
    # the exception line of each attempt, and the summary's one line: not the launcher's verdict too
    assert text.count("ValueError: bad batch number 0") == 3, text
    assert any("failed twice the same way" in line and "ValueError: bad batch number 0" in line
               for line in text.splitlines()), text
    log = (tmp_path / "runs" / "experiments" / "1" / "trial_1.log").read_text()
    assert log.count("\nValueError: bad batch number 0\n") == 2  # kept in the trial's log (one rank starts warm:
    # forked without a launcher, so no launcher's `rank 0 failed with exit code 1: ...` line follows it)
    assert log.count("Traceback (most recent call last):") == 2 and "determined_trials/loop/" in log  # every frame

