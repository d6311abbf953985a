"""``det.pytorch.init()`` and ``Trainer(trial, context).fit(...)``: run a PyTorchTrial under the loop."""

from __future__ import annotations

import contextlib
import datetime
import os
import random
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from determined_trials import core
from determined_trials._info import get_cluster_info
from determined_trials.config import ExperimentConfig, load_config
from determined_trials.errors import CollectiveError
from determined_trials.experiment._gc import collect_bare_trial_garbage
from determined_trials.loop import Batch, Controller, ExitReason, HookRunner, LoopSettings, TrainUnit, TrialAdapter
from determined_trials.loop._resume import interrupt_stops_training, resolve_resume
from determined_trials.pytorch._adapter import PyTorchAdapter
from determined_trials.pytorch._callback import overrides_hook
from determined_trials.pytorch._context import PyTorchTrialContext
from determined_trials.pytorch._trial import PyTorchTrial, check_trial_class

__all__ = ["init", "open_trial_context", "Trainer", "seed_everything"]


class _ClosableContext(Protocol):
    def _close(self) -> None: ...


_C = TypeVar("_C", bound=_ClosableContext)

_DEFAULT_REPORTING_PERIOD = Batch(100)
# The schema needs a metric name; a searcher the user did not write never enforces it (see Trainer.fit).
_DEFAULT_SEARCHER = {"name": "single", "metric": "validation_loss", "max_length": {"batches": 100}}


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs (all devices) from the trial seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _experiment_config(exp_conf: Any, hparams: Mapping[str, Any] | None) -> tuple[ExperimentConfig | None, bool]:
    """The config to run with (``exp_conf``, else one holding ``hparams`` as constants, else None: the
    launcher's) and whether its ``searcher`` (hence ``searcher.metric``) was written by the user."""
    if exp_conf is not None:
        if isinstance(exp_conf, Mapping) and not exp_conf.get("searcher"):
            return load_config({**exp_conf, "searcher": _DEFAULT_SEARCHER}), False
        return load_config(exp_conf), True
    if hparams is not None:
        return load_config({"hyperparameters": dict(hparams), "searcher": _DEFAULT_SEARCHER}), False
    return None, True


def _distributed_from_environment() -> core.DistributedContext | None:
    """Under torchrun (WORLD_SIZE > 1): start torch.distributed (gloo on CPU, nccl on CUDA).

    Collectives that wait longer than ``$DET_COLLECTIVE_TIMEOUT`` seconds (default 1800) fail
    instead of hanging the job.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch.distributed as dist

    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=_collective_timeout())
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timeout)
    return core.DistributedContext.from_torch_distributed()


def _collective_timeout() -> float:
    raw = os.environ.get("DET_COLLECTIVE_TIMEOUT", "1800")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"DET_COLLECTIVE_TIMEOUT={raw!r} must be a positive number of seconds, e.g. 600")
    return seconds


@contextlib.contextmanager
def init(
    *,
    hparams: Mapping[str, Any] | None = None,
    exp_conf: Any = None,
    distributed: core.DistributedContext | None = None,
    aggregation_frequency: int = 1,
    enable_tensorboard_logging: bool = True,
    run_dir: str | os.PathLike[str] | None = None,
) -> Iterator[PyTorchTrialContext]:
    """A ``PyTorchTrialContext`` for a ``Trainer``: use as ``with det.pytorch.init() as context:``.

    Under a launcher the config, hparams and trial come from it; in a plain script from
    ``exp_conf`` (a path, YAML dict or parsed config) and/or ``hparams``. RNGs are seeded from the
    trial seed (``reproducibility.experiment_seed`` locally). ``run_dir`` is a local addition.
    """
    config, metric_named = _experiment_config(exp_conf, hparams)

    def make_context(core_context: core.Context) -> PyTorchTrialContext:
        context = PyTorchTrialContext(
            core_context=core_context, config=config, hparams=hparams,
            aggregation_frequency=aggregation_frequency, enable_tensorboard_logging=enable_tensorboard_logging,
        )
        context._searcher_metric_named = metric_named
        return context

    with open_trial_context(make_context, config, distributed, _distributed_from_environment, run_dir) as context:
        yield context


@contextlib.contextmanager
def open_trial_context(
    make_context: Callable[[core.Context], _C],
    config: ExperimentConfig | None,
    distributed: core.DistributedContext | None,
    from_environment: Callable[[], core.DistributedContext | None],
    run_dir: str | os.PathLike[str] | None,
) -> Iterator[_C]:
    """The body of every ``init()``: the Core API context (with ``distributed``, else the one
    ``from_environment`` gives, closed at the end), seeded RNGs, then ``make_context(core)``."""
    dist = distributed or from_environment()
    with contextlib.ExitStack() as owned:
        if distributed is None and dist is not None:
            owned.callback(dist.close)  # ours (from the environment): close it, or the next init collides
        core_context = owned.enter_context(core.init(distributed=dist, config=config, run_dir=run_dir))
        seed_everything(core_context.info.trial.trial_seed)
        context = make_context(core_context)
        try:
            yield context
        finally:
            context._close()


class Trainer:
    """Trains a PyTorchTrial: ``Trainer(trial, context).fit(max_length=Epoch(5), ...)``."""

    def __init__(self, trial: PyTorchTrial, context: PyTorchTrialContext) -> None:
        check_trial_class(type(trial))
        if not isinstance(context, PyTorchTrialContext) or context._core is None:
            raise TypeError("Trainer needs the context from `with det.pytorch.init() as context:`")
        self._trial = trial
        self._context = context
        self.exit_reason: ExitReason | None = None

    def fit(
        self,
        checkpoint_period: TrainUnit | None = None,
        validation_period: TrainUnit | None = None,
        max_length: TrainUnit | None = None,
        reporting_period: TrainUnit | None = _DEFAULT_REPORTING_PERIOD,
        checkpoint_policy: str = "best",
        latest_checkpoint: str | None = None,
        step_zero_validation: bool = False,
        test_mode: bool = False,
        profiling_enabled: bool = False,
        *,
        show_progress: bool | None = None,
    ) -> None:
        """Train until ``max_length`` (or, when it is None, each searcher operation of the config),
        validating and checkpointing at the given periods, and resuming from ``latest_checkpoint``.

        A preemption (SIGTERM/SIGUSR1, or a first Ctrl-C) or ``context.set_stop_requested(True)``
        ends training after the current batch, with a checkpoint; ``self.exit_reason`` says which.
        ``latest_checkpoint="latest"`` resumes the newest checkpoint of an earlier run (continuing
        its trial); in a plain script a Ctrl-C stop then raises ``det.errors.TrainingInterrupted``
        (exit status 75). A second Ctrl-C aborts at once.
        """
        core_context = self._context._core
        assert core_context is not None
        searcher = self._context.config.searcher
        metric = searcher.metric if self._context._searcher_metric_named else None
        settings = LoopSettings(
            max_length=max_length, validation_period=validation_period, checkpoint_period=checkpoint_period,
            reporting_period=reporting_period, checkpoint_policy=checkpoint_policy,
            step_zero_validation=step_zero_validation, test_mode=test_mode, profiling_enabled=profiling_enabled,
            show_progress=show_progress, searcher_metric=metric, smaller_is_better=searcher.smaller_is_better,
        )
        latest_checkpoint = resolve_resume(core_context, latest_checkpoint)
        trial = core_context.info.trial  # a resumed plain script continues the trial it resumes
        self._context._trial_id, self._context._trial_seed = trial.trial_id, trial.trial_seed
        hooks = HookRunner(self._trial.build_callbacks())
        if overrides_hook(hooks.callbacks.values(), "on_checkpoint_end"):
            warnings.warn("PyTorchCallback.on_checkpoint_end is deprecated; override on_checkpoint_write_end "
                          "(same argument, same moment) instead", FutureWarning, stacklevel=2)
        adapter = self._make_adapter(hooks)
        controller = Controller(core=core_context, adapter=adapter, hooks=hooks, settings=settings)
        with interrupt_stops_training(core_context) as exits:
            try:
                self.exit_reason = controller.run(latest_checkpoint)
            except RuntimeError as exc:
                _name_unresponsive_ranks(exc, core_context.distributed)
                raise
            exits.append(self.exit_reason)
        if self.exit_reason is ExitReason.COMPLETED and checkpoint_policy == "all" and get_cluster_info() is None:
            collect_bare_trial_garbage(core_context, self._context.config)

    def _make_adapter(self, hooks: HookRunner) -> TrialAdapter:
        """The loop's adapter for this trainer's trial (the DeepSpeed Trainer gives its own)."""
        return PyTorchAdapter(self._trial, self._context, hooks)


def _name_unresponsive_ranks(exc: RuntimeError, dist: core.DistributedContext) -> None:
    """After a torch.distributed failure (gloo says "Timed out waiting 5000ms for recv" and no
    rank), ask every rank over the DistributedContext (waiting at most its timeout, which is also
    the process group's): raise a CollectiveError naming the ranks that did not answer."""
    if dist.get_size() <= 1 or isinstance(exc, CollectiveError) or not _from_torch_distributed(exc):
        return
    try:
        dist.allgather(("torch.distributed failed", dist.get_rank()))
    except CollectiveError as probe:
        raise CollectiveError(
            f"a torch.distributed collective failed on rank {dist.get_rank()}: {exc}. Asking every rank "
            f"over the DistributedContext: {probe}"
        ) from exc


def _from_torch_distributed(exc: RuntimeError) -> bool:
    dist_error = getattr(torch.distributed, "DistError", ())
    return isinstance(exc, dist_error) or "gloo" in str(exc).lower()

