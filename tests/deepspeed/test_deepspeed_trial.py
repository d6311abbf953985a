"""DeepSpeedTrial in one process (gloo group of one, ``torch_adam``, no JIT builds): the same hooks and
weights as the equivalent PyTorchTrial, sharded checkpoints and their consolidation, ``from_config``,
``overwrite_deepspeed_config``, the import paths, and every error raised before or at the first batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.helpers_process_group import drop_process_group
from trials_deepspeed import DSTrial, TorchTwin, config, ds_config, make_model, weights

import determined_trials as det
from determined_trials import deepspeed as det_ds
from determined_trials import pytorch
from determined_trials.cli.main import main as cli_main
from determined_trials.deepspeed._distributed import start_deepspeed_distributed
from determined_trials.errors import ConfigError

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)

FIT: dict[str, Any] = {"max_length": det_ds.Batch(20), "reporting_period": det_ds.Batch(6),
                       "validation_period": det_ds.Epoch(1), "checkpoint_period": det_ds.Batch(10),
                       "checkpoint_policy": "none", "show_progress": False}


@pytest.fixture(scope="module", autouse=True)
def _own_process_group() -> Iterator[None]:
    """DeepSpeed needs torch.distributed: a group of one in this process, taken down after these tests."""
    yield
    drop_process_group()


def _fit(tmp_path: Path, trial_cls: Any = DSTrial, fit: dict[str, Any] | None = None, **hparams: Any) -> Any:
    with det_ds.init(exp_conf=config(**hparams), run_dir=tmp_path / "run") as context:
        trial = trial_cls(context)
        det_ds.Trainer(trial, context).fit(**(fit or FIT))
        return trial


def test_hooks_and_weights_match_the_pytorch_trial(tmp_path: Path) -> None:
    ds = _fit(tmp_path / "ds")
    with pytorch.init(exp_conf=config(), run_dir=tmp_path / "pt") as context:
        twin = TorchTwin(context)
        pytorch.Trainer(twin, context).fit(**FIT)
    assert [e[0] for e in ds.events] == [e[0] for e in twin.events]  # every hook, same order and count
    assert [e for e in ds.events if e[0] in ("epoch_start", "epoch_end")] == \
        [e for e in twin.events if e[0] in ("epoch_start", "epoch_end")]
    assert weights(ds.engine) == [p.detach().reshape(-1).tolist() for p in twin.model.parameters()]
    ds_val = [e[1]["val_loss"] for e in ds.events if e[0] == "validation_end"]
    assert ds_val == pytest.approx([e[1]["val_loss"] for e in twin.events if e[0] == "validation_end"], rel=1e-6)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_checkpoint_holds_every_shard_and_consolidates(tmp_path: Path, stage: int) -> None:
    trial = _fit(tmp_path, stage=stage, gas=2, fit={**FIT, "max_length": det_ds.Batch(4)})
    # ZeRO-3 swaps torch.nn.functional.linear for the process; the trial's end puts torch's back
    assert torch.nn.functional.linear is torch._C._nn.linear
    store = det.core.LocalStore(tmp_path / "run")
    (checkpoint,) = store.checkpoints()
    folder = tmp_path / "run" / "checkpoints" / checkpoint.uuid
    model_states = "model0/zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3 else \
        "model0/mp_rank_00_model_states.pt"  # ZeRO-3: each rank its partition
    assert {"det_state_rank0.pth", "trial_state.json", "load_data.json", model_states} <= set(checkpoint.resources)
    assert any("optim_states" in name for name in checkpoint.resources) == (stage > 0)
    assert json.loads((folder / "load_data.json").read_text())["trial_type"] == "DeepSpeedTrial"
    state = det_ds.consolidate_checkpoint(folder)
    model = make_model()
    model.load_state_dict(state)
    assert [p.detach().reshape(-1).tolist() for p in model.parameters()] == weights(trial.engine)
    with pytest.raises(FileNotFoundError, match="no engine checkpoint 'model7'"):
        det_ds.consolidate_checkpoint(folder, tag="model7")
    export = tmp_path / "export"
    assert cli_main(["--run-dir", str(tmp_path / "run"), "checkpoint", "export", checkpoint.uuid, str(export),
                     "--consolidate"]) == 0
    exported = torch.load(export / "model0_consolidated.pt", weights_only=True)
    assert exported.keys() == state.keys() and all(torch.equal(exported[k], state[k]) for k in state)


def test_zero_init_builds_the_model_partitioned_under_stage_3_only(tmp_path: Path) -> None:
    hp = config(stage=3)["hyperparameters"]
    (tmp_path / "ds.json").write_text(json.dumps(ds_config(hp)))
    with det_ds.init(exp_conf=config(stage=3), run_dir=tmp_path / "run") as context:
        with context.zero_init(tmp_path / "ds.json"):  # a file or a dict
            partitioned = make_model()
        with context.zero_init(ds_config({**hp, "stage": 2})):
            whole = make_model()
    assert all(p.numel() == 0 and hasattr(p, "ds_id") for p in partitioned.parameters())
    assert [p.numel() for p in whole.parameters()] == [64, 16, 16, 1] and not hasattr(whole[0].weight, "ds_id")


def test_padding_batches_count_no_records() -> None:
    from determined_trials.deepspeed._data import CountingIterator

    batches = [torch.zeros(3, 2), torch.ones(2, 2)]
    padded = CountingIterator(batches, padding=lambda: torch.full((5, 2), 7.0))
    assert [next(padded).sum().item(), padded.take_records(), next(padded).sum().item(), padded.take_records()] == \
        [0.0, 3, 4.0, 2]
    assert torch.equal(next(padded), batches[1]) and padded.take_records() is None  # repeats its last batch
    empty = CountingIterator([], padding=lambda: torch.full((5, 2), 7.0))  # a rank with no batch of its own
    assert next(empty).sum().item() == 70.0 and empty.take_records() is None
    with pytest.raises(StopIteration):
        next(CountingIterator(batches[:0]))


class _OptedOutRawLoader(DSTrial):
    def __init__(self, context: det_ds.DeepSpeedTrialContext) -> None:
        super().__init__(context)
        context.disable_dataset_reproducibility_checks()

    def build_training_data_loader(self) -> Any:
        return torch.utils.data.DataLoader(super().build_training_data_loader().dataset, batch_size=4)


def test_a_raw_loader_after_the_opt_out_trains_in_whole_batches(tmp_path: Path) -> None:
    trial = _fit(tmp_path, _OptedOutRawLoader, gas=2, fit={**FIT, "max_length": det_ds.Epoch(1)})
    assert trial.engine.global_steps == 8 and trial.calls == 16  # 64 records: 16 micro-batches, 8 batches
    assert [e for e in trial.events if e[0].startswith("epoch")] == [("epoch_start", 0), ("epoch_end", 0)]


def test_from_config_builds_a_context_for_debugging() -> None:
    context = det_ds.DeepSpeedTrialContext.from_config(config(stage=0))
    trial = DSTrial(context)
    assert context.get_train_micro_batch_size_per_gpu() == 4 and context.get_num_micro_batches_per_slot() == 1
    loader = trial.build_training_data_loader()
    metrics = trial.train_batch(iter(loader), 0, 0)
    assert metrics["loss"].item() > 0 and trial.engine.global_steps == 1


def test_deepspeed_is_told_the_local_size_so_its_cpu_accelerator_forks_no_numactl(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from deepspeed.accelerator import get_accelerator

    def no_process(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"DeepSpeed ran {args} to count its devices")

    for name in ("LOCAL_SIZE", "LOCAL_WORLD_SIZE"):  # set first, so that the test's end removes what the call sets
        monkeypatch.setenv(name, "")  # (a delenv of an unset variable records nothing to undo: LOCAL_SIZE=2 leaked
        monkeypatch.delenv(name)  # into later tests' processes, and a 2-node Ray DeepSpeed trial saw 2 local ranks)
    start_deepspeed_distributed()  # a lone process: nothing a job it launches later would inherit
    assert "LOCAL_SIZE" not in os.environ
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # a rank of torchrun (or launch.torch_distributed)
    monkeypatch.setattr(subprocess, "check_output", no_process)  # `numactl --hardware`, once per ZeRO-3 backward
    start_deepspeed_distributed()
    assert os.environ["LOCAL_SIZE"] == "2" and get_accelerator().device_count() == 2


def test_overwrite_deepspeed_config_merges_leaves_and_leaves_inputs_alone(tmp_path: Path) -> None:
    base = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
            "optimizer": {"type": "SGD", "params": {"lr": 0.001, "weight_decay": 3e-7}},
            "zero_optimization": {"stage": 0}}
    source = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"params": {"lr": 0.001}}, "new": {"a": 1}}
    before = json.dumps([base, source])
    expected = {**json.loads(json.dumps(base)), "train_micro_batch_size_per_gpu": 2, "new": {"a": 1}}
    assert det_ds.overwrite_deepspeed_config(base, source) == expected
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(base))
    assert det_ds.overwrite_deepspeed_config(str(path), source) == expected
    assert json.dumps([base, source]) == before
    with pytest.raises(TypeError, match="Expected string or dict"):
        det_ds.overwrite_deepspeed_config(3, source)  # type: ignore[arg-type]
    path.write_text('{"a": 1, "a": 2}')
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        det_ds.overwrite_deepspeed_config(path, {})


def test_the_two_import_paths_are_one_module() -> None:
    code = ("import determined_trials.pytorch.deepspeed as x; from determined_trials import deepspeed as y\n"
            "from determined_trials.pytorch import deepspeed as z\nimport determined_trials as det\n"
            "print(x is y is z is det.pytorch.deepspeed, x.DeepSpeedTrial is y.DeepSpeedTrial)")  # test_import_rules: no deepspeed
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True", "True"]


# -- errors ------------------------------------------------------------------------------------------


class _ListMetrics(DSTrial):
    def train_batch(self, dataloader_iter: Any, epoch_idx: int, batch_idx: int) -> Any:
        return [super().train_batch(dataloader_iter, epoch_idx, batch_idx)["loss"]]


class _ChangingKeys(DSTrial):
    def evaluate_batch(self, dataloader_iter: Any, batch_idx: int) -> dict[str, Any]:
        metrics = super().evaluate_batch(dataloader_iter, batch_idx)
        return metrics if batch_idx == 0 else {"other": metrics["val_loss"]}


class _RawLoader(DSTrial):
    def build_training_data_loader(self) -> Any:
        return torch.utils.data.DataLoader(super().build_training_data_loader().dataset, batch_size=4)


class _OneMicroBatch(DSTrial):
    def __init__(self, context: det_ds.DeepSpeedTrialContext) -> None:
        super().__init__(context)
        context.disable_auto_grad_accumulation()  # but train_batch below still runs one micro-batch


class _TwoMicroBatches(DSTrial):
    def train_batch(self, dataloader_iter: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        next(dataloader_iter)  # one micro-batch too many: the resume position would be wrong
        return super().train_batch(dataloader_iter, epoch_idx, batch_idx)


class _WrongBatchSize(DSTrial):
    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(super().build_training_data_loader().dataset, batch_size=3)


@pytest.mark.parametrize(("trial_cls", "hparams", "error", "match"), [
    (_ListMetrics, {}, TypeError, "train_batch must return a tensor .* or a dict of metrics, got list"),
    (_ChangingKeys, {}, ValueError, "evaluate_batch must return the same metric names for every batch"),
    (_RawLoader, {}, TypeError, "not a det.pytorch.DataLoader.*disable_dataset_reproducibility_checks"),
    (_OneMicroBatch, {"gas": 2}, RuntimeError, r"took 0 optimizer steps, expected exactly 1.*"
                                                r"gradient_accumulation_steps \(2\).*= 8 records"),
    (_TwoMicroBatches, {}, RuntimeError, "batch 0: train_batch took 2 micro-batches from dataloader_iter, but one "
                                         "batch is gradient_accumulation_steps = 1 micro-batches"),
    (_WrongBatchSize, {}, ValueError, "batch_size=3 but the DeepSpeed config has train_micro_batch_size_per_gpu=4"),
])
def test_trial_errors(tmp_path: Path, trial_cls: Any, hparams: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _fit(tmp_path, trial_cls, **hparams)


def test_context_errors() -> None:
    import deepspeed

    context = det_ds.DeepSpeedTrialContext.from_config(config(global_batch_size=32))
    mpu = det_ds.ModelParallelUnit(0, 1, True, True)
    with pytest.raises(RuntimeError, match="call `wrap_model_engine` before setting the mpu"):
        context.set_mpu(mpu)
    with pytest.raises(RuntimeError, match="get_train_micro_batch_size_per_gpu.*wrap_model_engine"):
        context.get_train_micro_batch_size_per_gpu()
    with pytest.raises(TypeError, match="takes the engine of deepspeed.initialize"):
        context.wrap_model_engine(make_model())
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=ds_config({"global_batch_size": 4, "micro": 4, "gas": 1, "stage": 0}))
    with pytest.raises(ConfigError, match="global_batch_size is 32 but the DeepSpeed engine's train_batch_size is 4"):
        context.wrap_model_engine(engine)
    ok = det_ds.DeepSpeedTrialContext.from_config(config())
    ok.wrap_model_engine(engine)
    ok.set_mpu(mpu)
    with pytest.raises(RuntimeError, match="Only one MPU"):
        ok.set_mpu(mpu)
    with pytest.raises(ValueError, match="data_parallel_rank 2 is not in"):
        det_ds.ModelParallelUnit(2, 2, True, True)


def test_the_harness_takes_a_deepspeed_trial_and_names_what_an_incomplete_one_lacks(tmp_path: Path) -> None:
    from determined_trials.launch import TrialSpecError
    from determined_trials.launch.harness import load_pytorch_trial as load_trial  # any family of the harness

    (tmp_path / "ds_spec_a.py").write_text(
        "from trials_deepspeed import DSTrial\nfrom determined_trials import deepspeed as det_ds\n\n"
        "class Mine(DSTrial):\n    pass\n\n"
        "class Incomplete(det_ds.DeepSpeedTrial):\n    def __init__(self, context):\n        pass\n"
    )
    assert load_trial("ds_spec_a.py:Mine", tmp_path).__name__ == "Mine"
    with pytest.raises(TrialSpecError, match="Incomplete does not define build_training_data_loader.*a DeepSpeedTrial needs them"):
        load_trial("ds_spec_a.py:Incomplete", tmp_path)


def test_the_trainer_rejects_a_context_not_from_init() -> None:
    context = det_ds.DeepSpeedTrialContext.from_config(config())
    with pytest.raises(TypeError, match=r"needs the context from `with det.deepspeed.init\(\)"):
        det_ds.Trainer(DSTrial(context), context)


def test_grouped_plan_keeps_whole_groups_per_epoch_and_starts_anywhere() -> None:
    from determined_trials.pytorch.data._plan import DefaultOrders, GroupedPlan, SampleOrderPlan

    inner = SampleOrderPlan(DefaultOrders(10, False, 0), per_rank=1, drop_last=False, rank=0, num_replicas=1)
    plan = GroupedPlan(inner, 3)  # 10 micro-batches per epoch: 3 groups of 3, the 10th is dropped
    assert plan.epoch_len == 9
    stream = plan.batches(0)
    assert [next(stream) for _ in range(12)] == [[i] for i in range(9)] + [[0], [1], [2]]
    resumed = plan.batches(7)  # mid-group of epoch 0 (kept-step numbering)
    assert [next(resumed) for _ in range(5)] == [[7], [8], [0], [1], [2]]
    with pytest.raises(ValueError, match="has 10 micro-batches per rank, fewer than the 11"):
        GroupedPlan(inner, 11)


_LOG_PROBE = """
import deepspeed  # first, as a trial's module may
import determined_trials.deepspeed
from deepspeed.utils import logger, set_log_level_from_string
set_log_level_from_string("info")  # DeepSpeed at INFO, as older versions and its launcher's default are
logger.info("probe-info")
logger.warning("probe-warning")
"""


@pytest.mark.parametrize(("level", "shown"), [(None, ["probe-warning"]), ("INFO", ["probe-info", "probe-warning"])])
def test_deepspeeds_own_info_lines_are_held_back_unless_asked(level: str | None, shown: list[str]) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "DET_DEEPSPEED_LOG_LEVEL"}
    if level:
        env["DET_DEEPSPEED_LOG_LEVEL"] = level
    done = subprocess.run([sys.executable, "-c", _LOG_PROBE], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert [w for w in ("probe-info", "probe-warning") if w in output] == shown, output
    if not level:
        assert "[INFO]" not in output, output
