"""Small PyTorchTrials for the trainer-level tests (importable, so checkpoints can name them)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import determined_trials as det
from determined_trials import pytorch

StepMode = pytorch.LRScheduler.StepMode


def config(hparams: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    """An experiment config: a single searcher on validation_loss, a fixed seed, ``hparams``."""
    conf: dict[str, Any] = {
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 8}},
        "hyperparameters": {"global_batch_size": 1, "lr": 0.1, **(hparams or {})},
        "reproducibility": {"experiment_seed": 1234},
    }
    conf.update(top)
    return conf


# -- data ------------------------------------------------------------------------------------------

LINEAR_XS = [0.5, 1.0, 1.5, 2.0, -1.0, 0.25, 3.0, -0.5]
LINEAR_TRUE_W = 3.0


class LinearData(torch.utils.data.Dataset[Any]):
    """(index, x, y) with y = 3 * x, for the closed-form checks."""

    def __init__(self, xs: Sequence[float] = LINEAR_XS) -> None:
        self.xs = list(xs)

    def __len__(self) -> int:
        return len(self.xs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.tensor([self.xs[i]])
        return torch.tensor(i), x, LINEAR_TRUE_W * x


class NoisyData(torch.utils.data.Dataset[Any]):
    """(index, features + torch.rand noise, target): augmentation drawn from the torch RNG."""

    def __init__(self, n: int = 24, features: int = 4) -> None:
        gen = torch.Generator().manual_seed(99)
        self.x = torch.randn(n, features, generator=gen)
        self.y = self.x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.tensor(i), self.x[i] + 0.05 * torch.rand(self.x.shape[1]), self.y[i]


# -- callbacks -------------------------------------------------------------------------------------


class Recorder(pytorch.PyTorchCallback):
    """Appends every hook call (name and the arguments that identify it) to ``events``."""

    def __init__(self, events: list[tuple[Any, ...]]) -> None:
        self.events = events
        self.validations = 0

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        self.events.append(("startup", first_batch_idx, checkpoint_uuid))

    def on_trial_shutdown(self) -> None:
        self.events.append(("shutdown",))

    def on_training_start(self) -> None:
        self.events.append(("training_start",))

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.events.append(("epoch_start", epoch_idx))

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.events.append(("epoch_end", epoch_idx))

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        self.events.append(("workload_end", dict(avg_metrics)))

    def on_validation_start(self) -> None:
        self.events.append(("validation_start",))

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.validations += 1
        self.events.append(("validation_end", dict(metrics)))

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        self.events.append(("checkpoint_load_start", sorted(checkpoint)))

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        self.events.append(("checkpoint_save_start",))

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        self.events.append(("checkpoint_write_end", checkpoint_dir))

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        self.events.append(("checkpoint_upload_end", uuid))

    def state_dict(self) -> dict[str, Any]:
        return {"validations": self.validations}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validations = int(state_dict["validations"])
        self.events.append(("callback_state_loaded", self.validations))


# -- the one-variable linear model -----------------------------------------------------------------


class LinearBase(pytorch.PyTorchTrial):
    """y = w * x (w starts at 0, no bias), SGD, MSE, unshuffled data; logs loss, w and lr per batch.

    hparams: lr, global_batch_size, clip (max grad norm, 0 = none), lr_mode (a StepMode name or
    ""), lr_frequency, manual_every (MANUAL_STEP: step every n batches), amp ("", "autocast", "use_amp").
    """

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.events: list[tuple[Any, ...]] = []
        self.log: list[dict[str, Any]] = []
        layer = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            layer.weight.zero_()
        self.layer = layer
        self.forward_dtypes: list[torch.dtype] = []  # of the layer's output, inside the model
        layer.register_forward_hook(lambda _m, _i, out: self.forward_dtypes.append(out.dtype))
        if context.get_hparams().get("amp") == "use_amp":
            context.experimental.use_amp()
        self.model = context.wrap_model(nn.Sequential(layer))
        self.output_dtypes: list[torch.dtype] = []  # of the model's output, as train_batch sees it
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr")))
        self.scheduler: Any = None
        mode = context.get_hparams().get("lr_mode", "")
        if mode:
            self.scheduler = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.5),
                step_mode=StepMode[mode], frequency=context.get_hparams().get("lr_frequency", 1),
            )

    @property
    def weight(self) -> float:
        return float(self.layer.weight.detach().reshape(()))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(LinearData(), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(LinearData(), batch_size=4)

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"recorder": Recorder(self.events)}

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.events.append(("batch", batch_idx))
        index, x, y = batch
        lr_before = self.optimizer.param_groups[0]["lr"]
        amp = self.context.get_hparams().get("amp", "")
        if amp == "autocast":
            with self.context.autocast():
                out = self.model(x)
            self.output_dtypes.append(out.dtype)
            out = out.float()
        else:
            out = self.model(x)
            self.output_dtypes.append(out.dtype)
        loss = nn.functional.mse_loss(out, y)
        self.context.backward(loss)
        clip = self.context.get_hparams().get("clip", 0)
        clip_fn = (lambda params: nn.utils.clip_grad_norm_(params, clip)) if clip else None
        self.context.step_optimizer(self.optimizer, clip_grads=clip_fn)
        every = self.context.get_hparams().get("manual_every", 0)
        if self.scheduler is not None and every and (batch_idx + 1) % every == 0:
            self.scheduler.step()
        self.log.append({
            "batch_idx": batch_idx, "epoch_idx": epoch_idx, "indices": index.tolist(),
            "loss": loss.item(), "w": self.weight, "lr": lr_before,
        })
        return loss


class LinearTrial(LinearBase):
    """The linear model, validated with evaluate_batch (validation_loss = MSE, AVG)."""

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        _, x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}


class ScriptedValidationTrial(LinearBase):
    """evaluate_full_dataset returns the next value of ``values`` as validation_loss."""

    def __init__(self, context: pytorch.PyTorchTrialContext, values: Sequence[float] = (1.0,)) -> None:
        super().__init__(context)
        self.values = list(values)
        self.validations = 0

    def evaluate_full_dataset(self, data_loader: torch.utils.data.DataLoader) -> dict[str, Any]:
        value = self.values[self.validations % len(self.values)]
        self.validations += 1
        records = sum(len(b[0]) for b in data_loader)
        return {"validation_loss": value, "records": torch.tensor(records)}


# -- reducers --------------------------------------------------------------------------------------


class SumOfSquares(pytorch.MetricReducer):
    """A MetricReducer: the sum of squares of every updated value, and how many there were."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.total = 0.0
        self.count = 0

    def update(self, values: torch.Tensor) -> None:
        self.total += float((values ** 2).sum())
        self.count += values.numel()

    def per_slot_reduce(self) -> tuple[float, int]:
        return self.total, self.count

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> dict[str, Any]:
        return {"sumsq": sum(t for t, _ in per_slot_metrics), "sumsq_count": sum(c for _, c in per_slot_metrics)}


def _concat(values: list[Any]) -> list[float]:
    return [float(v) for tensor in values for v in tensor.reshape(-1)]


class ReducerTrial(LinearTrial):
    """Wraps a function reducer (named, gets the flat update list) and a MetricReducer (dict
    results); evaluate_batch reports three metrics reduced by an evaluation_reducer dict."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.seen_xs = context.wrap_reducer(_concat, name="xs_seen")
        self.sumsq = context.wrap_reducer(SumOfSquares())

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        loss = super().train_batch(batch, epoch_idx, batch_idx)
        _, x, _ = batch
        self.seen_xs.update(x)
        self.sumsq.update(x)
        return {"loss": loss, "x_mean": x.mean()}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        index, x, _ = batch
        self.seen_xs.update(x)
        self.sumsq.update(x)
        return {"validation_loss": x.sum(), "x_sum": x.sum(), "x_max": x.max(), "first_index": index[0]}

    def evaluation_reducer(self) -> dict[str, pytorch.Reducer]:
        R = pytorch.Reducer
        return {"validation_loss": R.AVG, "x_sum": R.SUM, "x_max": R.MAX, "first_index": R.MIN}


# -- exact resume ----------------------------------------------------------------------------------


class ResumeTrial(pytorch.PyTorchTrial):
    """An MLP with dropout, Adam and a StepLR every batch, on shuffled noisy data.

    hparams: global_batch_size, lr, hidden, workers. Constructor arguments steer the run:
    ``stop_after`` (set_stop_requested on that batch_idx); ``flag_path``, ``flag_batch`` and
    ``batch_sleep`` (on that batch_idx, write the file then sleep: the SIGTERM test's window);
    ``compile_backend`` (wrap ``torch.compile(model, backend=...)`` instead of the model); ``amp_dtype``
    (``experimental.use_amp(amp_dtype)``); ``pin_memory`` (the training loader's).
    """

    def __init__(
        self,
        context: pytorch.PyTorchTrialContext,
        stop_after: int | None = None,
        flag_path: str | None = None,
        flag_batch: int = 3,
        batch_sleep: float = 0.0,
        compile_backend: str | None = None,
        amp_dtype: torch.dtype | None = None,
        pin_memory: bool = False,
    ) -> None:
        self.context = context
        self.pin_memory = pin_memory
        if amp_dtype is not None:
            context.experimental.use_amp(amp_dtype)
        self.stop_after = stop_after
        self.flag_path, self.flag_batch, self.batch_sleep = flag_path, flag_batch, batch_sleep
        self.seen: list[tuple[int, int, list[int]]] = []
        self.inputs: list[torch.Tensor] = []
        hidden = context.get_hparams().get("hidden", 8)
        model: nn.Module = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 1))
        if compile_backend is not None:
            model = torch.compile(model, backend=compile_backend)  # type: ignore[assignment]
        self.model = context.wrap_model(model)
        self.optimizer = context.wrap_optimizer(torch.optim.Adam(self.model.parameters(), lr=context.get_hparam("lr")))
        self.scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.8), StepMode.STEP_EVERY_BATCH,
        )

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            NoisyData(), batch_size=self.context.get_per_slot_batch_size(), shuffle=True,
            num_workers=self.context.get_hparams().get("workers", 0), pin_memory=self.pin_memory,
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(NoisyData(n=8), batch_size=4)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        index, x, y = batch
        self.seen.append((epoch_idx, batch_idx, index.tolist()))
        self.inputs.append(x.clone())
        return train_step(self, nn.functional.mse_loss(self.model(x), y), batch_idx)

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        _, x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}


def train_step(trial: Any, loss: torch.Tensor, batch_idx: int) -> torch.Tensor:
    """Backward and step, then the resume tests' steering: on ``flag_batch`` rank 0 writes ``flag_path`` and
    sleeps ``batch_sleep`` (the SIGTERM window); on ``stop_after`` the trial asks to stop."""
    trial.context.backward(loss)
    trial.context.step_optimizer(trial.optimizer)
    if trial.flag_path and batch_idx == trial.flag_batch and trial.context.distributed.get_rank() == 0:
        Path(trial.flag_path).write_text(str(batch_idx))
        time.sleep(trial.batch_sleep)
    if batch_idx == trial.stop_after:
        trial.context.set_stop_requested(True)
    return loss


def state_snapshot(trial: Any) -> dict[str, Any]:
    """Deep copies of the model's (the user's module under a torch.compile wrapper) and optimizer's
    state dicts."""
    model = getattr(trial.model, "_orig_mod", trial.model)
    return {
        "model": copy.deepcopy(model.state_dict()),
        "optimizer": copy.deepcopy(trial.optimizer.state_dict()),
    }


def assert_same_state(left: Any, right: Any, where: str = "state") -> None:
    """Bitwise equality of nested tensors, numbers and containers."""
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor) and left.dtype == right.dtype, where
        assert torch.equal(left, right), f"{where} differs"
    elif isinstance(left, dict):
        assert isinstance(right, dict) and left.keys() == right.keys(), f"{where}: keys {left.keys()} != {right.keys()}"
        for key in left:
            assert_same_state(left[key], right[key], f"{where}.{key}")
    elif isinstance(left, (list, tuple)):
        assert isinstance(right, (list, tuple)) and len(left) == len(right), where
        for i, (a, b) in enumerate(zip(left, right)):
            assert_same_state(a, b, f"{where}[{i}]")
    else:
        assert left == right, f"{where}: {left!r} != {right!r}"


def fit(
    trial_factory: Callable[[pytorch.PyTorchTrialContext], Any],
    conf: dict[str, Any],
    run_dir: Path,
    init_kwargs: dict[str, Any] | None = None,
    **fit_kwargs: Any,
) -> tuple[Any, pytorch.Trainer, dict[str, Any]]:
    """Build the trial in a fresh ``det.pytorch.init`` and fit it; returns (trial, trainer, info)
    with info: trial_id, this trial's checkpoints, training/validation metrics and searcher ops."""
    fit_kwargs.setdefault("show_progress", False)
    with pytorch.init(exp_conf=conf, run_dir=run_dir, **(init_kwargs or {})) as context:
        trial = trial_factory(context)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(**fit_kwargs)
        core = context._core
        assert core is not None
        trial_id = context.get_trial_id()
        info = {
            "trial_id": trial_id,
            "checkpoints": core.store.checkpoints(trial_id=trial_id),
            "training": core.store.metrics(trial_id, group="training"),
            "validation": core.store.metrics(trial_id, group="validation"),
            "searcher_ops": core.store.searcher_ops(trial_id),
        }
    return trial, trainer, info


_ = det
