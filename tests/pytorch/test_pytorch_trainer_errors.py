"""Trainer.fit errors and edge cases: evaluate methods, unwrapped model/optimizer, raw torch loaders
(refused, or accepted with the opt-out and never hanging), non-numeric metrics, resuming into
another architecture, resuming past max_length, and a Trainer built with the wrong context."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from trials_pytorch import LinearBase, LinearData, LinearTrial, ResumeTrial, config, fit

from determined_trials import pytorch
from determined_trials.pytorch import Batch, Epoch

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)

# -- evaluate methods, wrapping ------------------------------------------------------------------


class _BothTrial(LinearTrial):
    def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
        return {"validation_loss": 0.0}


class _NeitherTrial(LinearBase):
    pass


@pytest.mark.parametrize(("cls", "word"), [(_BothTrial, "both"), (_NeitherTrial, "neither")])
def test_exactly_one_evaluate_method(tmp_path: Path, cls: type, word: str) -> None:
    with pytest.raises(TypeError, match=rf"defines {word} of evaluate_batch\(\) and evaluate_full_dataset\(\)"):
        fit(cls, config(), tmp_path, max_length=Batch(1))


class _NoModelTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context, self.events = context, []
        self.model = torch.nn.Linear(1, 1)


class _NoOptimizerTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context, self.events = context, []
        self.model = context.wrap_model(torch.nn.Linear(1, 1))


@pytest.mark.parametrize(("cls", "what"), [(_NoModelTrial, "wrapped no model"),
                                           (_NoOptimizerTrial, "wrapped no optimizer")])
def test_unwrapped_model_or_optimizer(tmp_path: Path, cls: type, what: str) -> None:
    with pytest.raises(RuntimeError, match=what):
        fit(cls, config(), tmp_path, max_length=Batch(1))


def test_trainer_needs_the_context_of_init(tmp_path: Path) -> None:
    detached = pytorch.PyTorchTrialContext.from_config(config())
    trial = LinearTrial(detached)
    with pytest.raises(TypeError, match=r"det\.pytorch\.init\(\)"):
        pytorch.Trainer(trial, detached)
    with pytest.raises(TypeError, match=r"det\.pytorch\.init\(\)"):
        pytorch.Trainer(trial, object())  # type: ignore[arg-type]
    with pytorch.init(exp_conf=config(), run_dir=tmp_path) as context, \
            pytest.raises(TypeError, match="not a subclass of det.pytorch.PyTorchTrial"):
        pytorch.Trainer(object(), context)  # type: ignore[arg-type]


# -- raw torch loaders ---------------------------------------------------------------------------


class _RawLoaderTrial(LinearTrial):
    """Returns ``loader_kind`` from build_training_data_loader: "torch" (a finite torch DataLoader),
    "unsized" (a re-iterable without len), "one_shot" (an iterator); opts out when ``opt_out``."""

    def __init__(self, context: pytorch.PyTorchTrialContext, loader_kind: str = "torch", opt_out: bool = True,
                 raw_validation: bool = False) -> None:
        super().__init__(context)
        self.loader_kind, self.raw_validation = loader_kind, raw_validation
        if opt_out:
            context.experimental.disable_dataset_reproducibility_checks()

    def build_training_data_loader(self) -> Any:
        loader = torch.utils.data.DataLoader(LinearData(), batch_size=2)
        if self.loader_kind == "unsized":
            return _Unsized(loader)
        if self.loader_kind == "one_shot":
            return iter(loader)
        return loader

    def build_validation_data_loader(self) -> Any:
        if self.raw_validation:
            return torch.utils.data.DataLoader(LinearData(), batch_size=4)
        return super().build_validation_data_loader()


class _Unsized:
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


def test_raw_torch_loader_needs_the_opt_out(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"disable_dataset_reproducibility_checks\(\)") as err:
        fit(lambda ctx: _RawLoaderTrial(ctx, opt_out=False), config(), tmp_path, max_length=Batch(1))
    assert "build_training_data_loader" in str(err.value) and "det.pytorch.DataLoader" in str(err.value)


def test_raw_validation_loader_needs_the_opt_out(tmp_path: Path) -> None:
    class _Trial(LinearTrial):
        def build_validation_data_loader(self) -> Any:
            return torch.utils.data.DataLoader(LinearData(), batch_size=4)

    with pytest.raises(TypeError, match="build_validation_data_loader"):
        fit(_Trial, config(), tmp_path, max_length=Batch(1))


@pytest.mark.timeout(60)
def test_finite_raw_loader_runs_epoch_after_epoch(tmp_path: Path) -> None:
    trial, trainer, info = fit(lambda ctx: _RawLoaderTrial(ctx, raw_validation=True), config(), tmp_path,
                               max_length=Batch(10), validation_period=Epoch(1))
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    assert [(e["epoch_idx"], e["batch_idx"]) for e in trial.log] == [(b // 4, b) for b in range(10)]
    assert [e["indices"] for e in trial.log] == [[2 * (b % 4), 2 * (b % 4) + 1] for b in range(10)]
    assert [e[1] for e in trial.events if e[0] == "epoch_end"] == [0, 1]
    assert [m.steps_completed for m in info["validation"]] == [4, 8, 10]


@pytest.mark.timeout(60)
def test_unsized_raw_loader_runs_pass_after_pass(tmp_path: Path) -> None:
    trial, trainer, _ = fit(lambda ctx: _RawLoaderTrial(ctx, loader_kind="unsized"), config(), tmp_path,
                            max_length=Batch(10))
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    assert [e["batch_idx"] for e in trial.log] == list(range(10))
    assert [e["indices"][0] for e in trial.log] == [2 * (b % 4) for b in range(10)]  # a new pass each time
    # each pass is an epoch: the loader running out ends it
    assert [e["epoch_idx"] for e in trial.log] == [b // 4 for b in range(10)]
    assert [e[1] for e in trial.events if e[0] == "epoch_start"] == [0, 1, 2]


def test_unsized_raw_loader_refuses_epoch_units(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="epoch length"):
        fit(lambda ctx: _RawLoaderTrial(ctx, loader_kind="unsized"), config(), tmp_path, max_length=Epoch(2))


@pytest.mark.timeout(60)
def test_exhausted_one_shot_loader_fails_instead_of_hanging(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="one-shot iterator"):
        fit(lambda ctx: _RawLoaderTrial(ctx, loader_kind="one_shot"), config(), tmp_path, max_length=Batch(10))


# -- metrics -------------------------------------------------------------------------------------


class _StringTrainingMetricTrial(LinearTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        return {"loss": super().train_batch(batch, epoch_idx, batch_idx), "note": "hello"}


class _StringValidationMetricTrial(LinearTrial):
    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        return {**super().evaluate_batch(batch), "label": "cat"}


@pytest.mark.parametrize(("cls", "key"), [(_StringTrainingMetricTrial, "note"),
                                          (_StringValidationMetricTrial, "label")])
def test_non_numeric_metric_names_the_key(tmp_path: Path, cls: type, key: str) -> None:
    with pytest.raises(TypeError, match=rf"metric '{key}' is a builtins\.str"):
        fit(cls, config(), tmp_path, max_length=Batch(2), validation_period=Batch(1))


class _BadReturnTrial(LinearTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        super().train_batch(batch, epoch_idx, batch_idx)
        return [1.0]


def test_train_batch_must_return_a_tensor_or_dict(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="train_batch must return a tensor"):
        fit(_BadReturnTrial, config(), tmp_path, max_length=Batch(1))


# -- resume edge cases ---------------------------------------------------------------------------


def _resume_conf(hidden: int) -> dict[str, Any]:
    return config({"global_batch_size": 4, "lr": 0.01, "hidden": hidden})


def test_resume_into_an_incompatible_model_fails_clearly(tmp_path: Path) -> None:
    _, _, info = fit(ResumeTrial, _resume_conf(8), tmp_path, max_length=Batch(2))
    uuid = info["checkpoints"][-1].uuid
    with pytest.raises(RuntimeError, match="does not fit model 0") as err:
        fit(ResumeTrial, _resume_conf(16), tmp_path, max_length=Batch(4), latest_checkpoint=uuid)
    assert "same model architecture" in str(err.value)


@pytest.mark.parametrize("length", [6, 4])
def test_resume_at_or_past_max_length_trains_nothing(tmp_path: Path, length: int) -> None:
    first, _, info = fit(LinearTrial, config({"global_batch_size": 2}), tmp_path, max_length=Batch(6))
    uuid = info["checkpoints"][-1].uuid
    trial, trainer, info2 = fit(LinearTrial, config({"global_batch_size": 2}), tmp_path,
                                max_length=Batch(length), latest_checkpoint=uuid)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    assert trial.log == []  # train_batch never called
    assert [e[0] for e in trial.events if e[0] in ("batch", "epoch_start", "validation_start")] == []
    assert [c.uuid for c in info2["checkpoints"]] == [uuid]  # the same trial went on; nothing new to save
    assert trial.weight == first.weight


def test_unknown_checkpoint_uuid(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no-such-uuid"):
        fit(LinearTrial, config(), tmp_path, max_length=Batch(2), latest_checkpoint="no-such-uuid")
