"""Where a trial's wall time goes: a PyTorchTrial run by `det-trials experiment create` that validates, fails once
after its first checkpoint (restarted from it: the batches after it are trained again, the replay) and is paused
and continued; its parts add up to its wall, which leaves out the time it was paused, and `trial describe` and
`experiment describe` show them."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.helpers_experiment import DET_TRIALS

from determined_trials.cli.main import main
from determined_trials.core import LocalStore
from determined_trials.core.store import TIME_PARTS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.usefixtures("cpu_device")]

_SLEEP_S = 0.05  # per batch: the training time is known

TRIAL_FILE = '''
import time
from pathlib import Path

import torch
from determined_trials import pytorch


class TimedTrial(pytorch.PyTorchTrial):
    """Sleeps ``sleep`` s a batch; its first attempt fails at batch ``fail_at`` (after the checkpoint at 10)."""

    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(4, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))
        self.marker = Path(context.get_hparam("marker"))

    def _data(self, n, seed):
        x = torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))
        return pytorch.DataLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)),
                                  batch_size=self.context.get_per_slot_batch_size(), shuffle=True)

    def build_training_data_loader(self):
        return self._data(200, 1)

    def build_validation_data_loader(self):
        return self._data(8, 2)

    def train_batch(self, batch, epoch_idx, batch_idx):
        if batch_idx == self.context.get_hparam("fail_at") and not self.marker.exists():
            self.marker.write_text("failed once")
            raise RuntimeError("the planned failure")
        time.sleep(self.context.get_hparam("sleep"))
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return loss

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}
'''


def _steps(run_dir: Path) -> int:
    if not (run_dir / "store.sqlite").exists():
        return 0
    store = LocalStore(run_dir)
    try:
        return max((m.steps_completed for m in store.metrics(1, "training")), default=0)
    except KeyError:
        return 0
    finally:
        store.close()


def _wait_for_step(run_dir: Path, steps: int, after_restart: bool, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _steps(run_dir) >= steps and (not after_restart or LocalStore(run_dir).trial(1).restarts == 1):
            return
        time.sleep(0.05)
    raise AssertionError(f"trial 1 did not reach step {steps} within {timeout} s")


def _measured_and_wall(run_dir: Path) -> tuple[float, float]:
    """The stored parts' sum and the runner's wall, as recorded (no clamping)."""
    with sqlite3.connect(run_dir / "store.sqlite") as conn:
        rows = dict(conn.execute("SELECT part, seconds FROM trial_time WHERE trial_id = 1").fetchall())
    return sum(rows.get(p, 0.0) for p in TIME_PARTS), rows["wall"]


def test_the_parts_of_a_restarted_paused_and_validated_trial_add_up_to_its_wall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx, run_dir = tmp_path / "ctx", tmp_path / "runs"
    ctx.mkdir()
    (ctx / "model_def.py").write_text(TRIAL_FILE)
    config = {
        "name": "timed", "entrypoint": "model_def:TimedTrial", "max_restarts": 2,
        "hyperparameters": {"global_batch_size": 1, "sleep": _SLEEP_S, "fail_at": 15,
                            "marker": str(tmp_path / "failed")},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 60}},
        "min_validation_period": {"batches": 10}, "min_checkpoint_period": {"batches": 10},
        "scheduling_unit": 5, "reproducibility": {"experiment_seed": 3},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    began = time.monotonic()
    with open(tmp_path / "create.out", "wb") as out:
        proc = subprocess.Popen([*DET_TRIALS, "--run-dir", str(run_dir), "experiment", "create",
                                 str(tmp_path / "config.yaml"), str(ctx), "--no-progress"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_step(run_dir, 25, after_restart=True)
        proc.send_signal(signal.SIGTERM)  # pause: the trial checkpoints and stops
        assert proc.wait(timeout=60) == 75, (tmp_path / "create.out").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    first_run = time.monotonic() - began
    time.sleep(2.0)  # paused: not the trial's time
    began = time.monotonic()
    assert main(["--run-dir", str(run_dir), "experiment", "continue", "1", "--no-progress"]) == 0
    runs = first_run + time.monotonic() - began

    store = LocalStore(run_dir)
    trial = store.trial(1)
    assert (trial.state, trial.restarts) == ("COMPLETED", 1)
    spent = store.trial_time(1, now=time.time())
    measured, wall = _measured_and_wall(run_dir)
    assert measured <= wall, spent  # no part counted twice, none outside the attempts
    assert wall == pytest.approx(spent["wall"]) and wall < runs  # the paused time is left out
    assert sum(spent[p] for p in (*TIME_PARTS, "other")) == pytest.approx(wall, rel=0.01)
    assert 60 * _SLEEP_S <= spent["train"] + spent["replay"] < 60 * _SLEEP_S + 3.0, spent
    assert 4 * _SLEEP_S < spent["replay"] < 10 * _SLEEP_S, spent  # batches 10-14 again, after the checkpoint at 10
    assert spent["start"] > 0.3 and spent["build"] > 0 and spent["restore"] > 0, spent  # three processes, two resumed
    assert spent["validation"] > 0 and spent["checkpoint"] > 0 and spent["queued"] >= 0, spent
    assert spent["other"] < 0.5 * wall, spent

    capsys.readouterr()
    print(spent, file=sys.stderr)  # the figures, for whoever reads the test's output
    assert main(["--run-dir", str(run_dir), "trial", "describe", "1", "--json"]) == 0
    described = json.loads(capsys.readouterr().out)["time"]
    assert set(described) == {*TIME_PARTS, "other", "wall"}
    assert described["replay"] == pytest.approx(spent["replay"])
    assert main(["--run-dir", str(run_dir), "trial", "describe", "1"]) == 0
    text = capsys.readouterr().out
    assert re.search(rf"replay: +{spent['replay']:.2f} s", text) and re.search(rf"wall: +{wall:.2f} s +100.0 %", text)
    assert main(["--run-dir", str(run_dir), "experiment", "describe", "1"]) == 0
    text = capsys.readouterr().out
    assert "goodput:" in text and f"{100 * spent['train'] / wall:.1f} %" in text
