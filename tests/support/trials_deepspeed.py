"""DeepSpeedTrials for the DeepSpeed tests (1 process here, 2 ranks in tests/support/worker_deepspeed.py), and the
plain PyTorch loop they are compared with: an MLP on fixed synthetic regression data, Adam with
``torch_adam`` (torch's AdamW, weight decay 0), ZeRO stage and gradient accumulation from hparams."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from trials_pytorch import Recorder

from determined_trials import deepspeed as det_ds
from determined_trials import pytorch
from determined_trials.pytorch._trainer import seed_everything
from determined_trials.pytorch.data._plan import epoch_permutation

os.environ.setdefault("DET_DEEPSPEED_SHM_COMM", "0")  # no JIT build of DeepSpeed's shm op in tests

TRAIN_RECORDS, VALIDATION_RECORDS, FEATURES = 64, 20, 4
SEED, LR = 2024, 0.01


def config(*, stage: int = 0, micro: int = 4, gas: int = 1, ranks: int = 1, length: int = 8,
           **hparams: Any) -> dict[str, Any]:
    """An experiment config whose hparams describe the DeepSpeed config (see ``ds_config``)."""
    return {
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": length}},
        "hyperparameters": {"global_batch_size": micro * gas * ranks, "stage": stage, "micro": micro, "gas": gas,
                            **hparams},
        "reproducibility": {"experiment_seed": SEED},
    }


def ds_config(hp: dict[str, Any]) -> dict[str, Any]:
    """hp ``scheduler``: a linear WarmupLR (20 steps); ``offload``: "optimizer" (``offload_optimizer`` to the CPU) or "param" (also ``offload_param``, ZeRO-3);
    either runs DeepSpeed's CPU Adam (``torch_adam`` off), whose op must be prebuilt (``make venv``)."""
    offload = hp.get("offload")
    zero: dict[str, Any] = {"stage": hp["stage"]}
    if hp["stage"] == 3:  # ZeRO-3 keeps parameters below a size whole on every rank; 0: partition even this tiny model's
        zero["stage3_param_persistence_threshold"] = 0
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    if offload == "param":
        zero["offload_param"] = {"device": "cpu"}
    return {
        "train_batch_size": hp["global_batch_size"],
        "train_micro_batch_size_per_gpu": hp["micro"],
        "gradient_accumulation_steps": hp["gas"],
        "optimizer": {"type": "Adam", "params": {"lr": LR, "weight_decay": 0.0, "torch_adam": not offload}},
        "zero_optimization": zero,
        **({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": LR,
                                                         "warmup_num_steps": 20, "warmup_type": "linear"}}}
           if hp.get("scheduler") else {}),
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        **({"bf16": {"enabled": True}} if hp.get("bf16") else {}),
    }


def data(n: int, seed: int) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=gen)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(n, 1, generator=gen)
    return torch.utils.data.TensorDataset(x, y)


def make_model(dropout: float = 0.0) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 1))


class DSTrial(det_ds.DeepSpeedTrial):
    """The MLP as a DeepSpeed engine; records its hook calls and stops itself after ``stop_after``."""

    def __init__(self, context: det_ds.DeepSpeedTrialContext, stop_after: int | None = None) -> None:
        import deepspeed

        self.context = context
        hp = context.get_hparams()
        model = self.build_model(hp)
        self.built_numel = sum(p.numel() for p in model.parameters())  # 0 when built partitioned (ZeRO-3)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(hp))
        self.engine = context.wrap_model_engine(engine)
        self.events: list[tuple[Any, ...]] = []
        self.stop_after = stop_after
        self.calls = self.eval_calls = 0
        self.sum_reducer = context.wrap_reducer(lambda values: float(sum(values)), name="records_seen")

    def build_model(self, hp: dict[str, Any]) -> nn.Module:
        with self.context.zero_init(ds_config(hp)):  # a no-op below ZeRO stage 3
            return make_model(hp.get("dropout", 0.0))

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"recorder": Recorder(self.events)}

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(data(TRAIN_RECORDS, 1), batch_size=self.context.get_train_micro_batch_size_per_gpu(),
                                  shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(data(self.context.get_hparams().get("val_records", VALIDATION_RECORDS), 2),
                                  batch_size=8)

    def train_batch(self, dataloader_iter: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = self.context.to_device(next(dataloader_iter))
        loss = nn.functional.mse_loss(self.engine(x), y)
        self.engine.backward(loss)
        self.engine.step()
        self.calls += 1
        self.sum_reducer.update(len(x))
        if self.stop_after == batch_idx:
            self.context.set_stop_requested(True)
        return {"loss": loss}

    def evaluate_batch(self, dataloader_iter: Any, batch_idx: int) -> dict[str, Any]:
        x, y = self.context.to_device(next(dataloader_iter))
        self.eval_calls += 1
        return {"val_loss": nn.functional.mse_loss(self.engine(x), y)}

    def load(self, context: det_ds.DeepSpeedTrialContext, path: Any) -> None:
        super().load(context, path)
        if context.get_hparams().get("record_loaded"):  # what the engine holds right after the resume
            self.loaded_state = full_state(self.engine)
            self.loaded_scheduler = scheduler_state(self.engine)


def scheduler_state(engine: Any) -> dict[str, Any] | None:
    return engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None


def full_state(engine: Any) -> dict[str, list[list[float]]] | None:
    """ZeRO 1-3: every parameter's whole fp32 master copy and Adam moments (gathered: a collective every rank
    calls), as nested lists in the module's parameter order; None below ZeRO 1."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    if engine.zero_optimization_stage() == 0:
        return None
    params = list(engine.module.parameters())
    flat = {"fp32": [safe_get_full_fp32_param(p) for p in params]}
    flat.update({key: [safe_get_full_optimizer_state(p, key) for p in params] for key in ("exp_avg", "exp_avg_sq")})
    return {key: [t.detach().float().reshape(-1).tolist() for t in tensors] for key, tensors in flat.items()}


class PretrainedTrial(DSTrial):
    """DSTrial whose model, built (partitioned under ZeRO-3) from other random weights, gets the plain loop's
    initial weights from a state_dict that only rank 0 reads: the recipe of docs/deepspeed.md."""

    def build_model(self, hp: dict[str, Any]) -> nn.Module:
        import deepspeed

        rank = self.context.distributed.get_rank()
        seed_everything(SEED)
        pretrained = make_model().state_dict() if rank == 0 else None  # e.g. torch.load(path, mmap=True)
        torch.manual_seed(SEED + 1)
        with self.context.zero_init(ds_config(hp)):
            model = make_model()
        with torch.no_grad():
            for name, param in model.named_parameters():  # one parameter whole at a time
                with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                    if rank == 0:
                        assert pretrained is not None
                        param.copy_(pretrained[name])
        return model


def weights(engine: Any) -> list[list[float]]:
    """The module's parameters as nested lists (fp32 master weights live in the module for ZeRO 0-2; ZeRO 3
    partitions them: they are gathered, a collective every rank calls)."""
    import deepspeed

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=engine.zero_optimization_stage() == 3):
        return [p.detach().float().reshape(-1).tolist() for p in params]


def plain_loop(batches: int, global_batch: int, dropout: float = 0.0) -> list[list[float]]:
    """The same model trained by hand: one AdamW step per global batch of ``global_batch`` consecutive
    records of each epoch's seeded order (the harness's data chain)."""
    seed_everything(SEED)
    model = make_model(dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    dataset = data(TRAIN_RECORDS, 1)
    per_epoch = TRAIN_RECORDS // global_batch
    for b in range(batches):
        epoch, step = divmod(b, per_epoch)
        order = epoch_permutation(TRAIN_RECORDS, SEED, epoch)
        x, y = dataset[order[step * global_batch:(step + 1) * global_batch].tolist()]
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


class PipeTrial(DSTrial):
    """The same MLP as a 2-stage ``PipelineModule`` (the engine pulls its micro-batches itself)."""

    def __init__(self, context: det_ds.DeepSpeedTrialContext, stop_after: int | None = None) -> None:
        import deepspeed
        from deepspeed.pipe import PipelineModule

        self.context = context
        hp = context.get_hparams()
        layers = list(make_model(hp.get("dropout", 0.0)))  # built whole on every rank: the plain loop's weights
        module = PipelineModule(layers=layers, num_stages=2, loss_fn=nn.MSELoss(), partition_method="uniform")
        engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(),
                                               config=ds_config(hp))
        self.engine = context.wrap_model_engine(engine)
        self.events = []
        self.stop_after = stop_after
        self.calls = self.eval_calls = 0
        self.sum_reducer = context.wrap_reducer(lambda values: float(sum(values)), name="records_seen")

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(data(VALIDATION_RECORDS, 2), batch_size=self.context.get_train_micro_batch_size_per_gpu())

    def train_batch(self, dataloader_iter: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        self.calls += 1
        return {"loss": self.engine.train_batch(data_iter=dataloader_iter)}

    def evaluate_batch(self, dataloader_iter: Any, batch_idx: int) -> dict[str, Any]:
        return {"val_loss": self.engine.eval_batch(data_iter=dataloader_iter)}


class TorchTwin(pytorch.PyTorchTrial):
    """DSTrial's model, data and optimizer as a PyTorchTrial (the hook trace and weights to compare with)."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(make_model())
        self.optimizer = context.wrap_optimizer(torch.optim.AdamW(self.model.parameters(), lr=LR, weight_decay=0.0))
        self.events: list[tuple[Any, ...]] = []

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"recorder": Recorder(self.events)}

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(data(TRAIN_RECORDS, 1), batch_size=self.context.get_per_slot_batch_size(),
                                  shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(data(VALIDATION_RECORDS, 2), batch_size=8)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"val_loss": nn.functional.mse_loss(self.model(x), y)}
