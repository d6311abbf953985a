"""The FSDP2 trial of tests/pytorch/test_fsdp.py, shared by the test process (one process, unsharded) and the
rank workers (tests/support/worker_fsdp.py, 2 gloo ranks, fully_shard per block and on the root): a 3-layer MLP
with AdamW and a StepLR on indexed synthetic data, recording the records each batch saw."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from determined_trials import pytorch

TRAIN_RECORDS = 48  # global batch 8: 6 batches an epoch; a double batch (16): 3
LENGTH = 12


def config(aggregation: int = 1, global_batch: int = 8, length: int = LENGTH, slots: int = 1,
           mesh: dict[str, int] | None = None, **hparams: Any) -> dict[str, Any]:
    """``slots`` and ``mesh``: ``resources.slots_per_trial`` and ``resources.mesh`` (tests/pytorch/test_mesh.py)."""
    return {
        "resources": {"slots_per_trial": slots, **({"mesh": mesh} if mesh else {})},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": length}},
        "hyperparameters": {"global_batch_size": global_batch, "lr": 0.01, **hparams},
        "reproducibility": {"experiment_seed": 4321},
        "optimizations": {"aggregation_frequency": aggregation},
    }


def fit_kwargs(length: int = LENGTH) -> dict[str, Any]:
    """``length`` batches; reports every 2, validation and a checkpoint every 4."""
    return {
        "max_length": pytorch.Batch(length), "reporting_period": pytorch.Batch(2),
        "validation_period": pytorch.Batch(4), "checkpoint_period": pytorch.Batch(4),
        "checkpoint_policy": "none", "show_progress": False,
    }


class IndexedData(torch.utils.data.Dataset[Any]):
    """(index, x, y) with y = x @ w + noise, fixed by ``seed``."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=gen)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(n, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.tensor(i), self.x[i], self.y[i]


def build_model(shard: bool, mixed_precision: bool = False) -> nn.Module:
    """The MLP; with ``shard`` (torch.distributed initialised) FSDP2 on each Linear, then the root;
    ``mixed_precision``: bfloat16 compute, float32 gradient reduction (MixedPrecisionPolicy)."""
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
    if shard:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if mixed_precision else MixedPrecisionPolicy()
        for block in (model[0], model[2], model[4]):
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    return model


class FSDPTrial(pytorch.PyTorchTrial):
    """``stop_after``: set_stop_requested(True) on that batch_idx; hparam ``clip``: clip the gradient norm."""

    def __init__(self, context: pytorch.PyTorchTrialContext, stop_after: int | None = None) -> None:
        self.context = context
        self.stop_after = stop_after
        self.seen: list[tuple[int, list[int]]] = []
        self.loaded: dict[str, Any] | None = None
        shard = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.model = context.wrap_model(self.build(shard))
        self.optimizer = context.wrap_optimizer(torch.optim.AdamW(self.model.parameters(), lr=context.get_hparam("lr")))
        if context.get_hparams().get("scheduler", True):
            context.wrap_lr_scheduler(torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.7),
                                      pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
        clip = context.get_hparams().get("clip")
        self.clip = None if clip is None else (lambda params: nn.utils.clip_grad_norm_(params, clip))
        self.norms: list[float] = []
        self.records = context.wrap_reducer(_sorted_records, name="records_trained", for_validation=False)
        self.syncs: list[bool | None] = []  # per batch: FSDP2's reduce_grads flag of the first block (None unsharded)

    def build(self, shard: bool) -> nn.Module:
        """The model to wrap (``shard``: torch.distributed is initialised)."""
        return build_model(shard, bool(self.context.get_hparams().get("mixed_precision")))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(IndexedData(TRAIN_RECORDS, 7), batch_size=self.context.get_per_slot_batch_size(),
                                  shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        hp = self.context.get_hparams()
        return pytorch.DataLoader(IndexedData(hp.get("val_records", 8), 8), batch_size=hp.get("val_batch", 4))

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"loaded": _RecordLoaded(self)}

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        index, x, y = batch
        self.seen.append((batch_idx, index.tolist()))
        self.syncs.append(_gradient_sync(self.model))
        self.records.update(index)
        loss = nn.functional.mse_loss(self.model(x).float(), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer, clip_grads=self._clip if self.clip else None)
        if batch_idx == self.stop_after:
            self.context.set_stop_requested(True)
        return {"loss": loss}

    def _clip(self, params: list[torch.Tensor]) -> None:
        assert self.clip is not None
        norm = self.clip(params)
        self.norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        _, x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x).float(), y)}


def _sorted_records(updates: list[torch.Tensor]) -> list[int]:
    """A function reducer: every record index trained since the last report, on every rank."""
    return sorted(int(i) for update in updates for i in update.reshape(-1))


def _gradient_sync(model: nn.Module) -> bool | None:
    """Whether FSDP2 will reduce-scatter the gradients of this backward (what set_requires_gradient_sync set)."""
    from determined_trials.pytorch.parallel._fsdp import is_fsdp

    if not is_fsdp(model):
        return None
    group = model[0]._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]
    return bool(group.reduce_grads)


class _RecordLoaded(pytorch.PyTorchCallback):
    """Records the full state right after a checkpoint was loaded (at on_training_start, every rank)."""

    def __init__(self, trial: FSDPTrial) -> None:
        self.trial = trial
        self.resumed = False

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        self.resumed = True

    def on_training_start(self) -> None:
        if self.resumed:
            self.trial.loaded = full_state(self.trial)


def full_state(trial: FSDPTrial) -> dict[str, Any]:
    """Unsharded weights and optimizer state (FQN keys), as nested lists (a collective under FSDP2)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_sd, optim_sd = get_state_dict(trial.model, trial.optimizer, options=StateDictOptions(full_state_dict=True))
    state = {f"model.{k}": v for k, v in model_sd.items()}
    for name, per_param in optim_sd["state"].items():
        for key, value in per_param.items():
            state[f"optim.{name}.{key}"] = value
    state["lr"] = trial.optimizer.param_groups[0]["lr"]
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
