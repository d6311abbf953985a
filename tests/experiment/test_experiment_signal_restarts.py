"""Restarts after a death by an outside signal (an OOM killer's or a node agent's SIGKILL): counted against
``max_restarts`` only, never "the same failure twice before the first report", which stays for a user's
bug that fails identically (the same Python exception line twice)."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from support.helpers_experiment import create

from determined_trials.core import LocalStore
from determined_trials.core.store import RunState
from determined_trials.experiment._outcomes import TrialOutcomes, killed_from_outside

KILLED_TRIAL_FILE = '''
import os
import signal
from pathlib import Path

import torch
from determined_trials import pytorch


class KilledTrial(pytorch.PyTorchTrial):
    """Killed with SIGKILL during start-up (before any report) in its first ``kill_times`` attempts."""

    def __init__(self, context):
        self.context = context
        hp = context.get_hparams()
        marker = Path(hp["kill_dir"]) / f"attempts_rank{context.distributed.get_rank()}"
        attempts = int(marker.read_text()) if marker.exists() else 0
        marker.write_text(str(attempts + 1))
        if attempts < hp["kill_times"] and context.distributed.get_rank() == hp["kill_rank"]:
            os.kill(os.getpid(), signal.SIGKILL)
        self.model = context.wrap_model(torch.nn.Linear(4, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def _data(self, n, seed):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 4, generator=gen)
        return pytorch.DataLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)),
                                  batch_size=self.context.get_per_slot_batch_size(), shuffle=True)

    def build_training_data_loader(self):
        return self._data(64, 1)

    def build_validation_data_loader(self):
        return self._data(16, 2)

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return loss

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}
'''


def _run(tmp_path: Path, kill_times: int, slots: int = 1, kill_rank: int = 0) -> tuple[LocalStore, str]:
    """Run the KilledTrial experiment in ``tmp_path``; returns its store and the trial's log."""
    ctx, kills = tmp_path / "ctx", tmp_path / "kills"
    ctx.mkdir(parents=True)
    kills.mkdir()
    (ctx / "model_def.py").write_text(KILLED_TRIAL_FILE)
    config = {"name": "killed", "entrypoint": "model_def:KilledTrial", "max_restarts": 30,
              "hyperparameters": {"global_batch_size": 4 * slots, "kill_times": kill_times,
                                  "kill_dir": str(kills), "kill_rank": kill_rank},
              "resources": {"slots_per_trial": slots}, "reproducibility": {"experiment_seed": 5},
              "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 8}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert create(tmp_path / "runs", path, ctx) == 0, (tmp_path / "runs" / "experiments" / "1" / "trial_1.log")
    return LocalStore(tmp_path / "runs"), (tmp_path / "runs" / "experiments" / "1" / "trial_1.log").read_text()


def _final_weights(store: LocalStore) -> dict[str, torch.Tensor]:
    latest = store.latest_checkpoint(1)
    assert latest is not None
    state = torch.load(store.path / "checkpoints" / latest.uuid / "state_dict.pth", weights_only=False)
    weights: dict[str, torch.Tensor] = state["models_state_dict"][0]
    return weights


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.usefixtures("cpu_device")
@pytest.mark.parametrize(("slots", "kill_rank"), [(1, 0), (2, 1)], ids=["one-rank", "rank-1-of-2"])
def test_a_rank_killed_twice_by_sigkill_before_its_first_report_restarts_and_completes(
    tmp_path: Path, slots: int, kill_rank: int,
) -> None:
    store, log = _run(tmp_path / "killed", kill_times=2, slots=slots, kill_rank=kill_rank)
    trial = store.trial(1)
    assert (trial.state, trial.restarts) == ("COMPLETED", 2), log
    assert store.experiment(1).state == "COMPLETED"
    assert (tmp_path / "killed" / "kills" / f"attempts_rank{kill_rank}").read_text() == "3"
    # the launcher's report of each kill: the rank's status 128 + SIGKILL, not a Python exception (one rank
    # starts warm, forked without a launcher: its own status is -SIGKILL, which the runner reports)
    assert log.count(f"rank {kill_rank} failed with exit code 137") == (2 if slots > 1 else 0), log
    clean, _ = _run(tmp_path / "clean", kill_times=0, slots=slots, kill_rank=kill_rank)
    killed_weights, clean_weights = _final_weights(store), _final_weights(clean)
    assert killed_weights.keys() == clean_weights.keys()
    for name, value in clean_weights.items():
        assert torch.equal(killed_weights[name], value), name


# -- the rule, without trial processes -------------------------------------------------------------


class _Store:
    """The little of LocalStore that ``TrialOutcomes._on_failed`` uses, for trial 1 with no reports."""

    def __init__(self) -> None:
        self.restarts, self.state, self.reason = 0, RunState.ACTIVE, ""

    def trial(self, trial_id: int) -> Any:
        return SimpleNamespace(id=trial_id, restarts=self.restarts, state=self.state)

    def increment_trial_restarts(self, trial_id: int) -> int:
        self.restarts += 1
        return self.restarts

    def set_trial_state(self, trial_id: int, state: RunState, reason: str | None = None) -> None:
        self.state, self.reason = state, reason or ""

    def metrics(self, trial_id: int, include_superseded: bool = False) -> list[Any]:
        return []

    def checkpoints(self, trial_id: int, include_deleted: bool) -> list[Any]:
        return []


def _fail_twice(code: int, reason: str) -> TrialOutcomes:
    """A runner whose trial 1 fails twice with exit status ``code`` and ``reason`` before any report."""
    outcomes = object.__new__(TrialOutcomes)
    store = _Store()
    outcomes.store = store  # type: ignore[assignment]
    outcomes._config = SimpleNamespace(max_restarts=30)
    outcomes._last_failure, outcomes._failure, outcomes._queue = {}, None, []
    outcomes._say = lambda message: None  # type: ignore[method-assign]
    outcomes._end_failed = lambda work: None  # type: ignore[method-assign]
    running = SimpleNamespace(work=SimpleNamespace(trial_id=1), proc=SimpleNamespace(reason=lambda c: reason))
    for _ in range(2):
        outcomes._on_failed(running, code)  # type: ignore[arg-type]
    return outcomes


@pytest.mark.parametrize(("code", "reason"), [
    (-9, "trial process failed (killed by SIGKILL): [rank=0] loading the model (whole output: /r/trial_1.log)"),
    (137, "trial process failed (exit code 137): torch_distributed: rank 1 failed with exit code 137 (1 more "
          "rank(s) failed after it): [rank=1] loading the model (whole output: /r/trial_1.log)"),
    (-15, "trial process failed (killed by SIGTERM): (no output) (whole output: /r/trial_1.log)"),
    (143, "trial process failed (exit code 143): (no output) (whole output: /r/trial_1.log)"),
])
def test_a_death_by_an_outside_signal_twice_is_restarted_within_max_restarts(code: int, reason: str) -> None:
    outcomes = _fail_twice(code, reason)
    assert killed_from_outside(code)
    assert outcomes._failure is None
    assert (outcomes.store.restarts, outcomes.store.state) == (2, RunState.ACTIVE)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("code", "reason"), [
    (1, "trial process failed (exit code 1): ValueError: bad batch number 0 (whole output: /r/trial_1.log)"),
    (1, "trial process failed (exit code 1): torch_distributed: rank 0 failed with exit code 1: "
        "RuntimeError: boom (whole output: /r/trial_1.log)"),
    (-int(signal.SIGSEGV), "trial process failed (killed by SIGSEGV): (no output) (whole output: /r/trial_1.log)"),
    (128 + int(signal.SIGABRT), "trial process failed (exit code 134): terminate called (whole output: /x.log)"),
])
def test_the_same_failure_of_the_code_twice_before_any_report_still_stops_early(code: int, reason: str) -> None:
    outcomes = _fail_twice(code, reason)
    assert not killed_from_outside(code)
    assert outcomes._failure is not None and "failed twice the same way before reporting anything" in outcomes._failure
    assert (outcomes.store.restarts, outcomes.store.state) == (1, RunState.ERROR)  # type: ignore[attr-defined]
