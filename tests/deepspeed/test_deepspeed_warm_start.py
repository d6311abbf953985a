"""A DeepSpeedTrial warm-started from another trial's checkpoint (``searcher.source_trial_id`` /
``source_checkpoint_uuid``): its first batch sees the source engine's module weights, with the engine's step
count, the optimizer and the trial's counters fresh; a module that does not fit names the first mismatched key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.helpers_process_group import drop_process_group
from support.helpers_warm_start import as_warm_started_trial
from trials_deepspeed import DSTrial, config, weights

from determined_trials import deepspeed as det_ds
from determined_trials.core import LocalStore

pytestmark = pytest.mark.usefixtures("cpu_device")

FIT: dict[str, Any] = {"max_length": det_ds.Batch(3), "checkpoint_policy": "none", "show_progress": False}


@pytest.fixture(scope="module", autouse=True)
def _own_process_group() -> Iterator[None]:
    yield
    drop_process_group()


class _Recorded(DSTrial):
    """Notes what its first batch sees: the module's weights, the engine's steps, the optimizer's state."""

    first: dict[str, Any] | None = None

    def train_batch(self, dataloader_iter: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        if self.first is None:
            self.first = {"weights": weights(self.engine), "at": (epoch_idx, batch_idx),
                          "engine_steps": self.engine.global_steps, "optimizer_state": len(self.engine.optimizer.state)}
        return super().train_batch(dataloader_iter, epoch_idx, batch_idx)


def _source(run_dir: Path) -> tuple[list[list[float]], str]:
    with det_ds.init(exp_conf=config(length=5), run_dir=run_dir) as context:
        trial = DSTrial(context)
        det_ds.Trainer(trial, context).fit(**{**FIT, "max_length": det_ds.Batch(5)})
        trial_id = context.get_trial_id()
    store = LocalStore(run_dir)
    latest = store.latest_checkpoint(trial_id)
    assert latest is not None and latest.steps_completed == 5
    return weights(trial.engine), latest.uuid


def test_a_warm_start_loads_the_source_module_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    source_weights, uuid = _source(run_dir)
    trial_id = as_warm_started_trial(monkeypatch, run_dir, config(length=3), uuid)
    with det_ds.init() as context:
        trial = _Recorded(context)
        assert weights(trial.engine) != source_weights  # its own initialisation until the warm start
        det_ds.Trainer(trial, context).fit(**FIT)
    assert trial.first == {"weights": source_weights, "at": (0, 0), "engine_steps": 0, "optimizer_state": 0}
    latest = LocalStore(run_dir).latest_checkpoint(trial_id)
    assert latest is not None and latest.steps_completed == 3  # its own counters, from 0


def test_a_module_that_does_not_fit_names_the_first_mismatched_key(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    _, uuid = _source(run_dir)

    class Wider(_Recorded):
        def __init__(self, context: det_ds.DeepSpeedTrialContext) -> None:
            import deepspeed

            self.context, self.events, self.stop_after, self.calls = context, [], None, 0
            model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.0),
                                        torch.nn.Linear(8, 1))
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config={"train_batch_size": 4, "optimizer": {
                                                       "type": "Adam", "params": {"lr": 0.01, "torch_adam": True}}})
            self.engine = context.wrap_model_engine(engine)
            self.sum_reducer = context.wrap_reducer(lambda values: float(sum(values)), name="records_seen")

    as_warm_started_trial(monkeypatch, run_dir, config(length=3), uuid)
    with det_ds.init() as context:
        trial = Wider(context)
        with pytest.raises(RuntimeError, match=r"first mismatched key '0.weight': shape \[16, 4\] in the checkpoint, "
                                               r"\[8, 4\] in the trial's model"):
            det_ds.Trainer(trial, context).fit(**FIT)
    assert trial.first is None  # nothing trained
