"""PyTorchTrialContext: wrapping and its errors, gradient aggregation and clipping in closed form,
AMP (bf16 autocast on CPU, use_amp), to_device, position getters, stop requests, TensorBoard."""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import determined_trials as det
from determined_trials.errors import ConfigError
from determined_trials.loop import Clock
from determined_trials.pytorch import LRScheduler, MetricReducer, PyTorchTrialContext

SEARCHER = {"name": "single", "metric": "loss", "max_length": 10}
CONFIG: dict[str, Any] = {
    "searcher": SEARCHER,
    "hyperparameters": {"lr": 0.1, "global_batch_size": 8, "layers": {"type": "const", "val": 2}},
    "data": {"path": "/data"},
    "reproducibility": {"experiment_seed": 5},
}
Point = collections.namedtuple("Point", ["x", "label"])


@pytest.fixture
def make_ctx(tmp_path: Path) -> Iterator[Any]:
    """Build contexts inside real Core API contexts (closed at the end of the test)."""
    cores: list[Any] = []

    def build(config: dict[str, Any] | None = None, **kwargs: Any) -> PyTorchTrialContext:
        """A context on the CPU (the tests feed it CPU tensors and expect bf16 AMP) unless ``device`` is
        given; ``device=None`` picks the default device."""
        kwargs.setdefault("device", "cpu")
        core = det.core.init(run_dir=tmp_path / f"run{len(cores)}", config=config or CONFIG)
        cores.append(core.__enter__())
        return PyTorchTrialContext(core_context=core, **kwargs)

    yield build
    for core in cores:
        core.__exit__(None, None, None)


def _start_batch(ctx: PyTorchTrialContext, batch_idx: int, epoch_len: int | None) -> Clock:
    """What the batch loop does before batch ``batch_idx``: the clock at it (its view handed over, as each fit's
    adapter does), then the context's per-batch step."""
    clock = Clock(batches_trained=batch_idx)
    clock.start(epoch_len)
    clock.begin()
    ctx._read_clock(clock.view)
    ctx._start_batch()
    return clock


def _linear(weight: float = 1.0) -> torch.nn.Linear:
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.constant_(model.weight, weight)
    return model


def _train(ctx: PyTorchTrialContext, model: Any, opt: Any, data: list[tuple[float, float]], **step: Any) -> list[float]:
    """One batch per (x, y), loss (w*x - y)^2; returns the weight after each batch."""
    weights = []
    for batch_idx, (x, y) in enumerate(data):
        _start_batch(ctx, batch_idx, len(data))
        loss = ((model(torch.tensor([[x]])) - y) ** 2).sum()
        ctx.backward(loss)
        ctx.step_optimizer(opt, **step)
        ctx._end_batch()
        weights.append(model.weight.item())
    return weights


# -- construction and getters ---------------------------------------------------------------------

def test_getters_come_from_the_core_context(make_ctx: Any, tmp_path: Path) -> None:
    ctx = make_ctx()
    assert ctx.get_hparams() == {"lr": 0.1, "global_batch_size": 8, "layers": 2}
    assert ctx.get_hparam("lr") == 0.1
    assert ctx.get_global_batch_size() == 8 and ctx.get_per_slot_batch_size() == 8
    assert ctx.get_experiment_config()["searcher"]["metric"] == "loss"
    assert ctx.get_data_config() == {"path": "/data"}
    assert ctx.get_trial_id() >= 1 and ctx.get_experiment_id() >= 1
    assert ctx.get_trial_seed() == 5 and ctx.get_initial_batch() == 0
    assert ctx.device == torch.device("cpu") and ctx.distributed.get_size() == 1
    default = make_ctx(device=None).device  # one process: the first GPU where there is one
    assert default == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    assert ctx.get_tensorboard_path().is_relative_to(tmp_path)
    with pytest.raises(KeyError, match="Available"):
        ctx.get_hparam("nope")


@pytest.mark.parametrize(("gpus", "local_rank", "size", "expected"), [
    (0, 0, 1, "cpu"), (0, 1, 2, "cpu"), (2, 0, 1, "cuda:0"), (2, 1, 2, "cuda:1"), (2, 3, 4, "cuda:1"),
])
def test_default_device_is_the_processs_gpu(
    monkeypatch: pytest.MonkeyPatch, gpus: int, local_rank: int, size: int, expected: str,
) -> None:
    """Without CUDA the CPU; one process takes cuda:0; several take cuda:<local_rank> (shared round
    robin when there are fewer GPUs than local processes) and make it the current device."""
    from determined_trials.pytorch.device._device import default_device

    current: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    assert default_device(local_rank, size) == torch.device(expected)
    assert current == ([torch.device(expected).index] if gpus and size > 1 else [])


def test_from_config_builds_a_debugging_context() -> None:
    ctx = PyTorchTrialContext.from_config(CONFIG)
    assert ctx.get_hparam("layers") == 2 and ctx.get_trial_id() == 0
    model = ctx.wrap_model(_linear())
    assert ctx.models == [model] and ctx.get_tensorboard_path().is_dir()


def test_constructor_arguments_override_and_check(make_ctx: Any) -> None:
    ctx = make_ctx(hparams={"a": 1}, trial_seed=9, enable_tensorboard_logging=False, device="cpu")
    assert ctx.get_hparams() == {"a": 1} and ctx.get_trial_seed() == 9
    assert ctx.get_enable_tensorboard_logging() is False
    ctx.set_enable_tensorboard_logging(True)
    assert ctx.get_enable_tensorboard_logging() is True
    with pytest.raises(TypeError, match="True or False"):
        ctx.set_enable_tensorboard_logging(1)
    with pytest.raises(ValueError, match="aggregation_frequency must be an int >= 1"):
        make_ctx(aggregation_frequency=0)
    with pytest.raises(TypeError, match="needs `config`"):
        PyTorchTrialContext(hparams={})


# -- wrapping -------------------------------------------------------------------------------------

def test_wrap_model_and_optimizer_register(make_ctx: Any) -> None:
    ctx = make_ctx()
    model = ctx.wrap_model(_linear())
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert ctx.models == [model] and ctx.optimizers == [opt] and ctx._inner_models() == [model]
    with pytest.raises(ValueError, match="already wrapped"):
        ctx.wrap_model(model)
    with pytest.raises(ValueError, match="already wrapped"):
        ctx.wrap_optimizer(opt)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        ctx.wrap_model(object())
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        ctx.wrap_optimizer(model)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=0)


def test_wrap_optimizer_checks_its_parameters(make_ctx: Any, caplog: pytest.LogCaptureFixture) -> None:
    ctx = make_ctx()
    model = ctx.wrap_model(_linear())
    with pytest.raises(ValueError, match="none of the optimizer.s parameters belong"):
        ctx.wrap_optimizer(torch.optim.SGD(_linear().parameters(), lr=0.1))
    extra = torch.nn.Parameter(torch.zeros(1))
    with caplog.at_level(logging.WARNING, logger="determined_trials.pytorch"):
        ctx.wrap_optimizer(torch.optim.SGD([*model.parameters(), extra], lr=0.1))
    assert "1 of the optimizer's 2 parameters are not in a wrapped model" in caplog.text


def test_wrap_lr_scheduler(make_ctx: Any) -> None:
    ctx = make_ctx()
    model = ctx.wrap_model(_linear())
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    mode = LRScheduler.StepMode.STEP_EVERY_BATCH
    assert ctx.wrap_lr_scheduler(sched, mode, frequency=2) is sched
    (wrapper,) = ctx.lr_schedulers
    assert wrapper.scheduler is sched and wrapper.frequency == 2 and wrapper.step_mode is mode
    other = torch.optim.SGD(_linear().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="optimizer was not wrapped"):
        ctx.wrap_lr_scheduler(torch.optim.lr_scheduler.StepLR(other, step_size=1), mode)
    with pytest.raises(TypeError, match="StepMode"):
        ctx.wrap_lr_scheduler(sched, "every batch")


def test_wrap_scaler_and_reducer(make_ctx: Any) -> None:
    ctx = make_ctx()
    scaler = torch.amp.GradScaler("cpu")
    assert ctx.wrap_scaler(scaler) is scaler and ctx.scalers == [scaler]
    with pytest.raises(ValueError, match="already wrapped"):
        ctx.wrap_scaler(scaler)
    with pytest.raises(TypeError, match="GradScaler"):
        ctx.wrap_scaler(object())
    reducer = ctx.wrap_reducer(lambda values: sum(values), name="total")
    assert isinstance(reducer, MetricReducer) and ctx.reducers.has_reducers(training=True)
    reducer.update(2)  # type: ignore[attr-defined]
    reducer.update(3)  # type: ignore[attr-defined]
    assert ctx.reducers.reduce(True, lambda x: [x]) == {"total": 5}


def test_step_optimizer_errors(make_ctx: Any) -> None:
    ctx = make_ctx(aggregation_frequency=2)
    model = ctx.wrap_model(_linear())
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="was not wrapped"):
        ctx.step_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="auto_zero_grads=False cannot be combined"):
        ctx.step_optimizer(opt, auto_zero_grads=False)
    with pytest.raises(RuntimeError, match="only known once training has started"):
        ctx.step_optimizer(opt)
    _start_batch(ctx, 0, 4)
    with pytest.raises(ValueError, match="scaler was not wrapped"):
        ctx.step_optimizer(opt, scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(TypeError, match="clip_grads"):
        ctx.step_optimizer(opt, clip_grads=3)
    with pytest.raises(TypeError, match="loss tensor"):
        ctx.backward(1.0)


class _TwoRanks:
    def get_size(self) -> int:
        return 2


def test_wrap_model_with_several_processes_needs_torch_distributed(make_ctx: Any) -> None:
    ctx = make_ctx()
    ctx._distributed = _TwoRanks()
    with pytest.raises(RuntimeError, match="torch.distributed is not initialised"):
        ctx.wrap_model(_linear())


# -- gradient aggregation and clipping (closed form) ----------------------------------------------
# w starts at 1; batch 0: x=1, y=3 -> dL/dw = 2(w x - y) x = -4; batch 1: x=2, y=0 -> +8.

DATA = [(1.0, 3.0), (2.0, 0.0)]


@pytest.mark.parametrize(("config_agg", "arg_agg"), [(2, 1), (1, 2), (2, 2)])
def test_aggregation_steps_every_second_batch_with_the_average(make_ctx: Any, config_agg: int, arg_agg: int) -> None:
    ctx = make_ctx({**CONFIG, "optimizations": {"aggregation_frequency": config_agg}}, aggregation_frequency=arg_agg)
    model = ctx.wrap_model(_linear())
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    stepped = []
    for batch_idx, (x, y) in enumerate(DATA):
        _start_batch(ctx, batch_idx, 2)
        ctx.backward(((model(torch.tensor([[x]])) - y) ** 2).sum())
        ctx.step_optimizer(opt)
        stepped.append(ctx._optimizer_stepped_this_batch)
        if batch_idx == 0:
            assert model.weight.item() == 1.0 and model.weight.grad.item() == -4.0  # accumulating
        ctx._end_batch()
    assert stepped == [False, True]
    assert model.weight.item() == pytest.approx(1 - 0.1 * (-4 + 8) / 2)  # 0.8
    assert model.weight.grad is None  # zeroed after the step


def test_aggregation_without_averaging(make_ctx: Any) -> None:
    config = {**CONFIG, "optimizations": {"aggregation_frequency": 2, "average_aggregated_gradients": False}}
    ctx = make_ctx(config)
    model = ctx.wrap_model(_linear())
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert _train(ctx, model, opt, DATA) == pytest.approx([1.0, 1 - 0.1 * 4])
    ctx2 = make_ctx(config)
    model2 = ctx2.wrap_model(_linear())
    opt2 = ctx2.wrap_optimizer(torch.optim.SGD(model2.parameters(), lr=0.1), average_aggregated_gradients=True)
    assert _train(ctx2, model2, opt2, DATA) == pytest.approx([1.0, 0.8])


def test_aggregation_conflicting_settings(make_ctx: Any) -> None:
    with pytest.raises(ConfigError, match="set it in one place"):
        make_ctx({**CONFIG, "optimizations": {"aggregation_frequency": 2}}, aggregation_frequency=3)


def test_without_aggregation_every_batch_steps(make_ctx: Any) -> None:
    ctx = make_ctx()
    model = ctx.wrap_model(_linear())
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    # batch 0: w = 1 + 0.4 = 1.4; batch 1: grad 2(2.8)2 = 11.2 -> w = 1.4 - 1.12 = 0.28
    assert _train(ctx, model, opt, DATA) == pytest.approx([1.4, 0.28])


def test_step_optimizer_outside_training_without_aggregation(make_ctx: Any) -> None:
    ctx = make_ctx()
    model = ctx.wrap_model(_linear())
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    ctx.backward(((model(torch.tensor([[1.0]])) - 3.0) ** 2).sum())
    ctx.step_optimizer(opt)  # no position needed when every batch steps
    assert model.weight.item() == pytest.approx(1.4)


def test_backward_passes_its_arguments_on_and_checks_the_loss(make_ctx: Any) -> None:
    ctx = make_ctx()
    model = ctx.wrap_model(_linear())
    out = model(torch.tensor([[1.0], [2.0]]))  # non-scalar: needs `gradient`
    ctx.backward(out, gradient=torch.tensor([[1.0], [0.5]]), retain_graph=True)
    assert model.weight.grad is not None and model.weight.grad.item() == pytest.approx(2.0)  # 1*1 + 0.5*2
    ctx.backward(out, gradient=torch.tensor([[1.0], [0.0]]))  # the graph was retained: a second pass works
    assert model.weight.grad.item() == pytest.approx(3.0)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        ctx.backward(out, gradient=torch.tensor([[1.0], [0.0]]))  # the default frees it
    model.weight.grad = None
    loss = (model(torch.tensor([[3.0]])) ** 2).sum()
    ctx.backward(loss, create_graph=True)  # the gradient itself gets a graph: 2*w*x^2
    assert model.weight.grad is not None and model.weight.grad.requires_grad
    with pytest.raises(TypeError, match="backward takes the loss tensor, got float"):
        ctx.backward(1.5)  # type: ignore[arg-type]


def test_clip_grads_gets_the_params_and_clips(make_ctx: Any) -> None:
    ctx = make_ctx()
    model = ctx.wrap_model(_linear())
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    seen: list[list[torch.Tensor]] = []

    def clip(params: list[torch.Tensor]) -> None:
        seen.append(params)
        torch.nn.utils.clip_grad_norm_(params, max_norm=0.5)

    assert _train(ctx, model, opt, DATA[:1], clip_grads=clip) == pytest.approx([1.05])  # grad -4 -> -0.5
    assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0] is model.weight


def test_manual_scaler_is_unscaled_before_clipping(make_ctx: Any) -> None:
    ctx = make_ctx()
    model = ctx.wrap_model(_linear())
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler = ctx.wrap_scaler(torch.amp.GradScaler("cpu", init_scale=1024.0))
    norms: list[float] = []
    _start_batch(ctx, 0, 1)
    ctx.backward(scaler.scale(((model(torch.tensor([[1.0]])) - 3.0) ** 2).sum()))
    ctx.step_optimizer(opt, clip_grads=lambda ps: norms.append(float(ps[0].grad.abs())), scaler=scaler)
    scaler.update()
    assert norms == [4.0] and model.weight.item() == pytest.approx(1.4)


# -- AMP ------------------------------------------------------------------------------------------

def test_bf16_autocast_on_cpu(make_ctx: Any) -> None:
    ctx = make_ctx()
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with ctx.autocast():
        assert (a @ b).dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32
    with ctx.autocast(enabled=False):
        assert (a @ b).dtype == torch.float32
    with pytest.raises(ValueError, match="float16 or torch.bfloat16"):
        ctx.autocast(dtype=torch.float64)


def _regression(ctx: PyTorchTrialContext, model: Any, opt: Any, steps: int = 60) -> list[float]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=gen)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    losses = []
    for batch_idx in range(steps):
        _start_batch(ctx, batch_idx, steps)
        out = model(x)
        assert out.dtype == torch.float32
        loss = torch.nn.functional.mse_loss(out, y)
        ctx.backward(loss)
        ctx.step_optimizer(opt, clip_grads=lambda ps: torch.nn.utils.clip_grad_norm_(ps, 10.0))
        ctx._end_batch()
        losses.append(loss.item())
    return losses


def test_use_amp_bf16_on_cpu_trains(make_ctx: Any) -> None:
    ctx = make_ctx()
    ctx.experimental.use_amp()
    model = ctx.wrap_model(torch.nn.Sequential(torch.nn.Linear(4, 1)))
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert ctx.scalers == []  # bf16 needs no loss scaling
    captured = []
    model[0].register_forward_hook(lambda m, i, o: captured.append(o.dtype))
    losses = _regression(ctx, model, opt)
    assert captured[0] == torch.bfloat16  # computed in bf16, handed back as float32
    assert losses[-1] < 0.05 * losses[0]
    ctx.experimental.use_amp()  # a second call with the same dtype changes nothing
    with pytest.raises(ValueError, match="already called"):
        ctx.experimental.use_amp(torch.float16)


def test_use_amp_fp16_uses_a_scaler_and_patches_earlier_models(make_ctx: Any) -> None:
    ctx = make_ctx(aggregation_frequency=2)
    model = ctx.wrap_model(torch.nn.Sequential(torch.nn.Linear(4, 1)))  # before use_amp: patched too
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.2))
    ctx.experimental.use_amp(torch.float16)
    (scaler,) = ctx.scalers
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 65536.0
    captured: list[torch.dtype] = []
    updates: list[None] = []
    model[0].register_forward_hook(lambda m, i, o: captured.append(o.dtype))
    update = scaler.update
    scaler.update = lambda *a: updates.append(update(*a))  # type: ignore[method-assign]
    losses = _regression(ctx, model, opt, steps=120)
    assert captured[0] == torch.float16 and losses[-1] < 0.05 * losses[0]
    assert len(updates) == 60  # one update per stepping batch
    with pytest.raises(ValueError, match="already manages a GradScaler"):
        ctx.wrap_scaler(torch.amp.GradScaler("cpu"))


def test_use_amp_after_wrap_scaler_is_an_error(make_ctx: Any) -> None:
    ctx = make_ctx()
    ctx.wrap_scaler(torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match="use one or the other"):
        ctx.experimental.use_amp(torch.float16)


# -- to_device ------------------------------------------------------------------------------------

class _Movable:
    def __init__(self) -> None:
        self.moved_to: Any = None

    def to(self, device: torch.device) -> _Movable:
        self.moved_to = device
        return self


def test_to_device_recurses_and_converts(make_ctx: Any, caplog: pytest.LogCaptureFixture) -> None:
    ctx = make_ctx()
    movable = _Movable()
    data = {
        "t": torch.ones(2),
        "np": np.arange(6, dtype=np.int64)[::-2],  # negative strides
        "bool": np.array([True, False]),
        "list": [Point(np.zeros(2, dtype=np.float32), 1), (torch.zeros(1), None)],
        "obj": movable,
        "names": np.array(["a", "b"]),
        "text": "id-1",
    }
    with caplog.at_level(logging.WARNING, logger="determined_trials.pytorch"):
        out = ctx.to_device(data)
        ctx.to_device(["more", "text"])
    assert torch.equal(out["np"], torch.tensor([5, 3, 1])) and out["bool"].dtype == torch.bool
    point = out["list"][0]
    assert isinstance(point, Point) and isinstance(point.x, torch.Tensor) and point.label == 1
    assert isinstance(out["list"][1], tuple) and out["list"][1][1] is None
    assert movable.moved_to == torch.device("cpu")
    assert out["names"] is data["names"] and out["text"] == "id-1"
    assert caplog.text.count("type 'str'") == 1 and caplog.text.count("type 'ndarray'") == 1
    readonly = np.ones(3)
    readonly.flags.writeable = False
    assert torch.equal(ctx.to_device(readonly), torch.ones(3, dtype=torch.float64))


# -- position, stop requests ----------------------------------------------------------------------

def test_position_getters(make_ctx: Any) -> None:
    ctx = make_ctx()
    for getter in (ctx.current_train_batch, ctx.current_train_epoch, ctx.is_epoch_start, ctx.is_epoch_end):
        with pytest.raises(RuntimeError, match="once training has started"):
            getter()
    _start_batch(ctx, 0, 3)
    assert (ctx.current_train_batch(), ctx.current_train_epoch(), ctx.is_epoch_start(), ctx.is_epoch_end()) \
        == (0, 0, True, False)
    _start_batch(ctx, 5, 3)
    assert (ctx.current_train_batch(), ctx.current_train_epoch(), ctx.is_epoch_start(), ctx.is_epoch_end()) \
        == (5, 1, False, True)
    clock = _start_batch(ctx, 7, None)
    clock.begin_pass(2, 0)  # a loader without len: its pass says where the epoch is
    assert (ctx.current_train_batch(), ctx.current_train_epoch(), ctx.is_epoch_start()) == (7, 2, True)
    with pytest.raises(RuntimeError, match="no len"):
        ctx.is_epoch_end()
    _start_batch(ctx, 8, None)
    assert ctx.current_train_batch() == 8
    for getter in (ctx.current_train_epoch, ctx.is_epoch_start, ctx.is_epoch_end):
        with pytest.raises(RuntimeError, match="no len"):
            getter()
    with pytest.raises(ValueError, match="epoch_len must be >= 1"):
        _start_batch(ctx, 1, -1)


def test_stop_requested(make_ctx: Any) -> None:
    ctx = make_ctx()
    assert ctx.get_stop_requested() is False
    ctx.set_stop_requested(True)
    assert ctx.get_stop_requested() is True
    with pytest.raises(TypeError, match="True or False"):
        ctx.set_stop_requested("yes")


def test_experimental_flags(make_ctx: Any) -> None:
    ctx = make_ctx()
    assert ctx.experimental._auto_to_device and ctx.experimental._dataset_checks
    ctx.experimental.disable_auto_to_device()
    ctx.experimental.disable_dataset_reproducibility_checks()
    assert not ctx.experimental._auto_to_device and not ctx.experimental._dataset_checks


# -- TensorBoard and profiler ---------------------------------------------------------------------

def test_tensorboard_writer_writes_in_the_trial_folder(make_ctx: Any, tmp_path: Path) -> None:
    ctx = make_ctx()
    writer = ctx.get_tensorboard_writer()
    assert ctx.get_tensorboard_writer() is writer
    writer.add_scalar("custom", 1.5, 3)
    ctx._close()
    files = list(ctx.get_tensorboard_path().glob("events.out.tfevents.*"))
    assert files and files[0].stat().st_size > 0
    assert ctx.get_tensorboard_path().is_relative_to(tmp_path / "run0" / "tensorboard")


def test_set_profiler_writes_a_trace(make_ctx: Any) -> None:
    ctx = make_ctx()
    model = ctx.wrap_model(torch.nn.Linear(4, 1))
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    ctx.set_profiler(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule)
    assert ctx._profiler is not None
    with ctx._profiler as profiler:
        for batch_idx in range(5):
            _start_batch(ctx, batch_idx, 5)
            ctx.backward(model(torch.randn(8, 4)).sum())
            ctx.step_optimizer(opt)
            profiler.step()
    assert list(ctx.get_tensorboard_path().glob("*.pt.trace.json"))
    with pytest.raises(TypeError, match="on_trace_ready"):
        ctx.set_profiler(on_trace_ready=print)
    assert ctx._profiler is profiler  # the failed call left the first one in place


# -- DDP over two processes -----------------------------------------------------------------------

@pytest.mark.slow
def test_ddp_aggregation_skips_sync_then_steps_with_the_global_average(tmp_path: Path) -> None:
    import ranks_pytorch_context as ranks

    from determined_trials.testing import run_ranks

    results = run_ranks(ranks.ddp_aggregation, 2, args=(str(tmp_path / "pg-store"), str(tmp_path)), timeout=120)
    # local gradients after batch 0 stay unsynchronised (no_sync): rank 0 -4, rank 1 0
    assert [r["grads"][0] for r in results] == [-4.0, 0.0]
    assert all(r["stepped"] == [False, True] for r in results)
    # accumulated: rank 0 -4 + 8 = 4, rank 1 0 + 12 = 12; mean over ranks 8, over 2 batches 4
    assert [r["weight"] for r in results] == pytest.approx([0.6, 0.6])
    assert all(r["wrapper"] == "DDPModel" and r["tag"] == "inner-attribute" for r in results)


@pytest.mark.slow
def test_reduce_metrics_and_run_cross_slot_reduction_over_two_processes(tmp_path: Path) -> None:
    """Determined's names for reducing by hand: ``reduce_metrics(for_training)`` (one allgather, on every
    rank), ``run_cross_slot_reduction(reducers, gathered)`` (e.g. on the chief) and ``reset_reducers``."""
    import ranks_pytorch_context as ranks

    from determined_trials.testing import run_ranks

    results = run_ranks(ranks.reducers_by_hand, 2, args=(str(tmp_path),), timeout=120)
    expected_total = (1 + 10) + (2 + 11)
    assert [r["training"] for r in results] == [{"total": expected_total}] * 2
    assert [r["validation"] for r in results] == [{"seen": [0, 1]}] * 2
    assert results[0]["by_hand"] == {"total": expected_total, "seen": [0, 1]} and results[1]["by_hand"] is None
    assert [r["after_reset"] for r in results] == [{"total": 0}] * 2
