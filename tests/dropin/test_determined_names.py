"""Public names Determined code reaches for: ``TrialContext.get_stop_requested`` / ``set_stop_requested`` /
``get_tensorboard_path`` / ``get_initial_batch`` on every family's context, ``PyTorchTrialContext.
reduce_metrics`` / ``reset_reducers`` / ``run_cross_slot_reduction`` (two processes: test_pytorch_context.py),
and ``det.pytorch.CheckpointLoadContext``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from trials_pytorch import ResumeTrial, assert_same_state, config, fit, state_snapshot

import determined_trials as det
from determined_trials import pytorch
from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")  # the trials train on the CPU


@pytest.fixture(scope="module", autouse=True)
def _own_process_group() -> Iterator[None]:
    """``DeepSpeedTrialContext.from_config`` starts a torch.distributed group of one in this process: take it
    down after these tests, or a later test that starts its own finds one already there."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()

CONF = config({"global_batch_size": 4, "lr": 0.01, "hidden": 8})
NAMES = ("get_stop_requested", "set_stop_requested", "get_tensorboard_path", "get_initial_batch")


def _family_contexts() -> list[Any]:
    contexts: list[Any] = [det.TrialContext.from_config(CONF), pytorch.PyTorchTrialContext.from_config(CONF),
                           det.deepspeed.DeepSpeedTrialContext.from_config(CONF)]
    try:
        contexts.append(det.keras.TFKerasTrialContext.from_config(CONF))
    except ImportError:  # no TensorFlow here: the other families still count
        pass
    return contexts


def test_every_family_context_has_the_trial_context_names() -> None:
    assert all(callable(getattr(det.TrialContext, name)) for name in NAMES)
    for context in _family_contexts():
        kind = type(context).__name__
        assert context.get_stop_requested() is False, kind
        context.set_stop_requested(True)
        assert context.get_stop_requested() is True, kind
        with pytest.raises(TypeError, match="True or False"):
            context.set_stop_requested("yes")
        assert context.get_initial_batch() == 0, kind
        folder = context.get_tensorboard_path()
        assert folder.is_dir() and context.get_tensorboard_path() == folder, kind  # one folder per context


def test_the_tensorboard_path_of_a_running_trial_is_its_core_folder(tmp_path: Path) -> None:
    with pytorch.init(exp_conf=CONF, run_dir=tmp_path) as context:
        assert context.get_tensorboard_path() == Path(context._core.train.get_tensorboard_path())
        assert context.get_tensorboard_path().is_relative_to(tmp_path)


def test_reducers_by_hand_in_one_process() -> None:
    context = pytorch.PyTorchTrialContext.from_config(CONF)
    total = context.wrap_reducer(sum, name="total")
    total.update(2)
    total.update(5)
    assert context.reduce_metrics(for_training=True) == {"total": 7}
    assert context.reduce_metrics(for_training=False) == {"total": 7}
    assert context.run_cross_slot_reduction([total], [[total.per_slot_reduce()]] * 2) == {"total": 14}
    context.reset_reducers()
    assert context.reduce_metrics(for_training=True) == {"total": 0}
    with pytest.raises(ValueError, match="not wrapped"):
        other = pytorch.PyTorchTrialContext.from_config(CONF).wrap_reducer(sum, name="total")  # another context's
        context.run_cross_slot_reduction([other], [[other.per_slot_reduce()]])


def test_checkpoint_load_context_builds_a_trial_with_extra_arguments(tmp_path: Path) -> None:
    trained, _, info = fit(ResumeTrial, CONF, tmp_path, max_length=Batch(6))
    folder = tmp_path / "checkpoints" / info["checkpoints"][-1].uuid
    context = pytorch.CheckpointLoadContext(CONF["hyperparameters"], CONF)
    assert isinstance(context, pytorch.PyTorchTrialContext)
    assert context.get_trial_seed() == 0 and context.get_trial_id() == 0 and context.distributed.get_size() == 1
    trial = ResumeTrial(context, stop_after=99)  # a constructor argument load_trial_from_checkpoint_path lacks
    saved = torch.load(folder / "state_dict.pth", weights_only=True)
    trial.model.load_state_dict(saved["models_state_dict"][0])
    assert trial.stop_after == 99
    assert_same_state(state_snapshot(trial)["model"], state_snapshot(trained)["model"])
    loaded = pytorch.load_trial_from_checkpoint_path(folder, trial_class=ResumeTrial)
    assert isinstance(loaded.context, pytorch.CheckpointLoadContext)


def test_checkpoint_load_context_without_or_with_a_foreign_config() -> None:
    bare = pytorch.CheckpointLoadContext({"hidden": 4, "lr": 0.1, "global_batch_size": 2})
    assert bare.get_hparam("hidden") == 4 and bare._searcher_metric_named  # nothing to train: no searcher needed
    cluster = {**CONF, "resources": {"slots_per_trial": 1}, "searcher": None}  # Determined's record, searcher null
    assert pytorch.CheckpointLoadContext(CONF["hyperparameters"], cluster).get_hparam("lr") == 0.01
