"""Exact resume through Trainer.fit: stop anywhere (set_stop_requested, SIGTERM), resume with
``latest_checkpoint`` and get the bitwise-identical model and optimizer, the same batch/epoch
indices and the same data (shuffled, with torch.rand augmentation, dropout, an LR scheduler and
worker processes). Also: what a checkpoint holds, and load_trial_from_checkpoint_path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from support.helpers_paths import SUPPORT
from trials_pytorch import ResumeTrial, assert_same_state, config, fit, state_snapshot

from determined_trials import pytorch
from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)

WORKER = SUPPORT / "worker_pytorch_sigterm.py"
LENGTH = 15  # 24 records, batches of 4: 6 batches per epoch, so 2.5 epochs
FIT: dict[str, Any] = {"max_length": Batch(LENGTH), "validation_period": Batch(5), "reporting_period": Batch(4)}


def resume_config(workers: int = 0, hidden: int = 8) -> dict[str, Any]:
    return config({"global_batch_size": 4, "lr": 0.01, "workers": workers, "hidden": hidden})


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """Uninterrupted runs, by number of loader workers (computed on first use)."""
    cache: dict[int, dict[str, Any]] = {}

    class _Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, workers: int) -> dict[str, Any]:
            run_dir = tmp_path_factory.mktemp(f"reference-{workers}")
            trial, trainer, info = fit(ResumeTrial, resume_config(workers), run_dir, **FIT)
            assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
            cache[workers] = {"trial": trial, "state": state_snapshot(trial), "info": info, "run_dir": run_dir}
            return cache[workers]

    return _Lazy()


def _stop_and_resume(run_dir: Path, stop_after: int, workers: int) -> tuple[ResumeTrial, ResumeTrial, Any]:
    first, trainer, info = fit(lambda ctx: ResumeTrial(ctx, stop_after=stop_after), resume_config(workers),
                               run_dir, **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "stopped"
    checkpoint = info["checkpoints"][-1]
    second, trainer, info2 = fit(ResumeTrial, resume_config(workers), run_dir, latest_checkpoint=checkpoint.uuid,
                                 **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    # the resumed run continues the same trial: one history, validations at 5, 10 and 15, none twice
    assert info2["trial_id"] == info["trial_id"]
    validated = [m.steps_completed for m in info2["validation"]]
    assert validated == [5, 10, 15]
    return first, second, checkpoint


def _assert_resumed_exactly(reference: dict[str, Any], first: ResumeTrial, second: ResumeTrial) -> None:
    ref: ResumeTrial = reference["trial"]
    epoch_orders = [sum((s[2] for s in ref.seen if s[0] == e), []) for e in (0, 1)]
    assert epoch_orders[0] != sorted(epoch_orders[0]) and epoch_orders[0] != epoch_orders[1]  # shuffled per epoch
    # the same batch_idx/epoch_idx sequence and the same records, in the same order
    assert first.seen + second.seen == ref.seen
    # the same augmented inputs (the torch.rand noise of __getitem__)
    combined = first.inputs + second.inputs
    assert len(combined) == len(ref.inputs)
    for i, (a, b) in enumerate(zip(combined, ref.inputs)):
        assert torch.equal(a, b), f"batch {i}: different inputs"
    # bitwise-identical model, optimizer (Adam moments, step) and LR scheduler
    assert_same_state(state_snapshot(second), reference["state"])
    assert second.scheduler.state_dict() == ref.scheduler.state_dict()
    assert second.optimizer.param_groups[0]["lr"] == ref.optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize(
    "stop_after",
    [
        0,  # right after the first batch
        8,  # mid-epoch (epoch 1, third batch)
        5,  # exactly at the end of epoch 0
        4,  # at a validation boundary (validation_period Batch(5))
        LENGTH - 1,  # on the last batch: the resumed run trains nothing
    ],
)
def test_stop_requested_then_resume_is_bitwise_identical(
    tmp_path: Path, reference: dict[int, dict[str, Any]], stop_after: int, capsys: pytest.CaptureFixture[str],
) -> None:
    first, second, checkpoint = _stop_and_resume(tmp_path, stop_after, workers=0)
    assert checkpoint.steps_completed == stop_after + 1  # honoured at the end of the current batch
    hint = (f"det-trials: stopped (set_stop_requested) after batch {stop_after + 1}: trial 1, checkpoint "
            f'{checkpoint.uuid} in {tmp_path}; resume with Trainer.fit(latest_checkpoint="latest")')
    assert capsys.readouterr().err.count(hint) == 1  # the stopped run says how to go on; the resumed one not
    assert len(first.seen) == stop_after + 1
    _assert_resumed_exactly(reference[0], first, second)


@pytest.mark.slow
@pytest.mark.parametrize("stop_after", [8, 5])
def test_resume_with_loader_workers_is_bitwise_identical(
    tmp_path: Path, reference: dict[int, dict[str, Any]], stop_after: int,
) -> None:
    first, second, checkpoint = _stop_and_resume(tmp_path, stop_after, workers=2)
    assert checkpoint.steps_completed == stop_after + 1
    _assert_resumed_exactly(reference[2], first, second)


def test_checkpoint_contents(tmp_path: Path) -> None:
    _, _, info = fit(lambda ctx: ResumeTrial(ctx, stop_after=6), resume_config(), tmp_path, **FIT)
    record = info["checkpoints"][-1]
    folder = tmp_path / "checkpoints" / record.uuid
    state = torch.load(folder / "state_dict.pth", weights_only=True)
    for key in ("models_state_dict", "optimizers_state_dict", "lr_schedulers_state_dict", "callbacks", "rng_state"):
        assert key in state, key
    assert len(state["models_state_dict"]) == 1 and "0.weight" in state["models_state_dict"][0]
    assert state["optimizers_state_dict"][0]["state"]  # Adam moments are there
    assert {"cpu_rng_state", "np_rng_state", "random_rng_state"} <= set(state["rng_state"])
    metadata = json.loads((folder / "metadata.json").read_text())
    assert metadata["steps_completed"] == 7 == record.steps_completed
    trial_state = json.loads((folder / "trial_state.json").read_text())
    assert trial_state["batches_trained"] == 7 and trial_state["epochs_trained"] == 1
    assert trial_state["last_validation"] == 5


@pytest.mark.slow
def test_sigterm_then_resume_is_bitwise_identical(tmp_path: Path, reference: dict[int, dict[str, Any]]) -> None:
    """A subprocess trains; on batch 3 it writes a flag and sleeps; the test sends SIGTERM then. The
    run checkpoints after batch 3 (4 batches trained) and exits; this process resumes it."""
    flag, out = tmp_path / "flag", tmp_path / "worker.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(tmp_path / "run"), str(flag), str(out)], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the worker never reached batch 3"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    result = json.loads(out.read_text())
    assert result["exit_reason"] == "preempted"
    assert result["steps_completed"] == 4, output  # the batch that was running when SIGTERM came
    assert len(result["seen"]) == 4
    second, trainer, _ = fit(ResumeTrial, resume_config(), tmp_path / "run",
                             latest_checkpoint=result["uuid"], **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    ref = reference[0]
    assert [tuple(s) for s in result["seen"]] + [tuple(s) for s in second.seen] == \
        [tuple(s) for s in ref["trial"].seen]
    assert_same_state(state_snapshot(second), ref["state"])
    # the checkpoint holds the weights the worker had when it stopped
    stopped = torch.load(result["weights"], weights_only=True)
    saved = torch.load(tmp_path / "run" / "checkpoints" / result["uuid"] / "state_dict.pth", weights_only=True)
    assert_same_state(saved["models_state_dict"][0], stopped)


def test_resume_with_a_stop_mid_aggregation(tmp_path: Path) -> None:
    """With aggregation_frequency=2 a stop after an odd batch leaves gradients accumulated but not
    applied; the resumed run must apply them as the uninterrupted one does."""
    conf = resume_config()
    conf["optimizations"] = {"aggregation_frequency": 2}
    ref, _, _ = fit(ResumeTrial, conf, tmp_path / "ref", **FIT)
    first, _, info = fit(lambda ctx: ResumeTrial(ctx, stop_after=2), conf, tmp_path / "run", **FIT)
    assert info["checkpoints"][-1].steps_completed == 3
    second, _, _ = fit(ResumeTrial, conf, tmp_path / "run", latest_checkpoint=info["checkpoints"][-1].uuid, **FIT)
    assert first.seen + second.seen == ref.seen
    assert_same_state(state_snapshot(second), state_snapshot(ref))


# -- load_trial_from_checkpoint_path ---------------------------------------------------------------


@pytest.mark.parametrize("with_class", [False, True])
def test_load_trial_from_checkpoint_path(tmp_path: Path, with_class: bool) -> None:
    trained, _, info = fit(ResumeTrial, resume_config(hidden=6), tmp_path, max_length=Batch(6))
    folder = tmp_path / "checkpoints" / info["checkpoints"][-1].uuid
    if with_class:
        loaded = pytorch.load_trial_from_checkpoint_path(folder, trial_class=ResumeTrial,
                                                         trial_kwargs={"stop_after": 99})
        assert loaded.stop_after == 99
    else:
        loaded = pytorch.load_trial_from_checkpoint_path(str(folder))
    assert type(loaded) is ResumeTrial
    assert loaded.context.get_hparam("hidden") == 6
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(3))
    trained.model.eval()
    loaded.model.eval()
    with torch.no_grad():
        assert torch.equal(loaded.model(x), trained.model(x))
    assert_same_state(loaded.model.state_dict(), trained.model.state_dict())


def test_load_trial_from_a_folder_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="load_data.json"):
        pytorch.load_trial_from_checkpoint_path(tmp_path)
