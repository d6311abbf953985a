"""A PBT child's start in a PyTorchTrial (another trial starting from its parent's checkpoint, as the runner
starts it): with unchanged hparams it continues bitwise as the parent's own resume does (weights, Adam
moments, StepLR, dropout RNG, shuffled data with torch.rand augmentation); with a new ``lr`` the optimizer
takes it (the schedule's progress kept, rescaled), its state stays the parent's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trials_pytorch import ResumeTrial, assert_same_state, config, fit, state_snapshot

from determined_trials import ClusterInfo, TrialInfo, pytorch
from determined_trials._info import CLUSTER_INFO_ENV
from determined_trials.core import LocalStore
from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")

ROUND = 6  # batches per round: a StepLR step of 3 has decayed the lr twice by then
FIT: dict[str, Any] = {"validation_period": Batch(ROUND), "reporting_period": Batch(3)}


def _conf(lr: float) -> dict[str, Any]:
    return config({"global_batch_size": 4, "lr": lr, "hidden": 8, "workers": 0})


class _Probe(ResumeTrial):
    """Records the optimizer and scheduler as the first training batch finds them."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.at_start: dict[str, Any] | None = None

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        if self.at_start is None:
            self.at_start = {"lr": self.optimizer.param_groups[0]["lr"],
                             "initial_lr": self.optimizer.param_groups[0]["initial_lr"],
                             "base_lrs": list(self.scheduler.base_lrs),
                             "state": {k: v.clone() for k, v in self.optimizer.state[self.optimizer.param_groups[0]["params"][0]].items()}}
        return super().train_batch(batch, epoch_idx, batch_idx)


def _child(monkeypatch: pytest.MonkeyPatch, run_dir: Path, parent_trial: int, checkpoint: str, lr: float) -> Any:
    """Start a new trial of the parent's experiment from ``checkpoint``, as the experiment runner does."""
    store = LocalStore(run_dir)
    parent = store.trial(parent_trial)
    conf = _conf(lr)
    hparams = {**parent.hparams, "lr": lr}
    child_id = store.create_trial(experiment_id=parent.experiment_id, hparams=hparams, seed=parent.seed,
                                  parent_trial_id=parent.id, parent_checkpoint=checkpoint, search_round=2)
    info = ClusterInfo(trial=TrialInfo(trial_id=child_id, experiment_id=parent.experiment_id, trial_seed=parent.seed,
                                       hparams=hparams, config=conf, steps_completed=ROUND),
                       run_dir=str(run_dir), latest_checkpoint=checkpoint, searcher_lengths=[2 * ROUND])
    monkeypatch.setenv(CLUSTER_INFO_ENV, str(info.write(run_dir / f"child_{child_id}.json")))
    trial, _, _ = fit(_Probe, conf, run_dir, max_length=Batch(2 * ROUND), **FIT)
    monkeypatch.delenv(CLUSTER_INFO_ENV)
    return trial


def test_an_unchanged_child_continues_bitwise_and_a_new_lr_reaches_the_optimizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_dir = tmp_path / "run"
    _, _, info = fit(ResumeTrial, _conf(0.01), run_dir, max_length=Batch(ROUND), **FIT)
    checkpoint = info["checkpoints"][-1]
    assert checkpoint.steps_completed == ROUND
    parent_on, _, _ = fit(ResumeTrial, _conf(0.01), run_dir, latest_checkpoint=checkpoint.uuid,
                          max_length=Batch(2 * ROUND), **FIT)  # the parent's own next round

    same = _child(monkeypatch, run_dir, info["trial_id"], checkpoint.uuid, lr=0.01)
    assert same.seen == parent_on.seen  # the same batches, in the same order, from the same position
    assert all(torch.equal(a, b) for a, b in zip(same.inputs, parent_on.inputs))
    assert_same_state(state_snapshot(same), state_snapshot(parent_on))
    assert same.scheduler.state_dict() == parent_on.scheduler.state_dict()

    saved = torch.load(run_dir / "checkpoints" / checkpoint.uuid / "state_dict.pth", weights_only=True)
    group = saved["optimizers_state_dict"][0]["param_groups"][0]
    assert group["initial_lr"] == 0.01 and group["lr"] == pytest.approx(0.01 * 0.8**2)  # two StepLR decays
    moved = _child(monkeypatch, run_dir, info["trial_id"], checkpoint.uuid, lr=0.03)
    assert moved.at_start is not None
    assert moved.at_start["initial_lr"] == 0.03 and moved.at_start["base_lrs"] == [0.03]
    assert moved.at_start["lr"] == pytest.approx(0.03 * 0.8**2)  # the new base, the schedule where it was
    parent_state = saved["optimizers_state_dict"][0]["state"][0]
    assert all(torch.equal(moved.at_start["state"][k], parent_state[k]) for k in parent_state)  # Adam moments kept
    assert moved.optimizer.param_groups[0]["lr"] == pytest.approx(0.03 * 0.8**4)  # and it trained with it
