"""``det.pytorch.init()`` and ``Trainer(trial, context).fit(...)``: run a PyTorchTrial under the loop."""

from __future__ import annotations

import contextlib
import datetime
import os
import random
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from determined_trials import core
from determined_trials.errors import CollectiveError
from determined_trials.loop import HookRunner, TrainerFront, TrialAdapter, experiment_config, open_trial_context
from determined_trials.pytorch._adapter import PyTorchAdapter
from determined_trials.pytorch._callback import overrides_hook
from determined_trials.pytorch._context import PyTorchTrialContext
from determined_trials.pytorch._trial import check_trial_class

__all__ = ["init", "Trainer", "seed_everything"]


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs (all devices) from the trial seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _distributed_from_environment() -> core.DistributedContext | None:
    """Under torchrun (WORLD_SIZE > 1): start torch.distributed (gloo on CPU, nccl on CUDA).

    Collectives that wait longer than ``$DET_COLLECTIVE_TIMEOUT`` seconds (default 1800) fail
    instead of hanging the job.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch.distributed as dist

    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=collective_timeout())
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timeout)
    return core.DistributedContext.from_torch_distributed()


def collective_timeout() -> float:
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
    config, metric_named = experiment_config(exp_conf, hparams)

    def make_context(core_context: core.Context) -> PyTorchTrialContext:
        context = PyTorchTrialContext(
            core_context=core_context, config=config, hparams=hparams,
            aggregation_frequency=aggregation_frequency, enable_tensorboard_logging=enable_tensorboard_logging,
        )
        if not metric_named:  # init() filled the searcher in
            context._searcher_metric_named = False
        return context

    with open_trial_context(make_context, config, distributed, _distributed_from_environment, run_dir,
                            seed_everything) as context:
        yield context


class Trainer(TrainerFront):
    """Trains a PyTorchTrial: ``Trainer(trial, context).fit(max_length=Epoch(5), ...)``."""

    _family = "pytorch"
    _context_class: ClassVar[type] = PyTorchTrialContext
    _check_trial_class = staticmethod(check_trial_class)

    def _make_hooks_and_adapter(self) -> tuple[HookRunner, TrialAdapter]:
        hooks = HookRunner(self._trial.build_callbacks())
        if overrides_hook(hooks.callbacks.values(), "on_checkpoint_end"):
            warnings.warn("PyTorchCallback.on_checkpoint_end is deprecated; override on_checkpoint_write_end "
                          "(same argument, same moment) instead", FutureWarning, stacklevel=3)
        return hooks, self._make_adapter(hooks)

    def _make_adapter(self, hooks: HookRunner) -> TrialAdapter:
        """The loop's adapter for this trainer's trial (the DeepSpeed Trainer gives its own)."""
        return PyTorchAdapter(self._trial, self._context, hooks)

    def _explain_failure(self, exc: RuntimeError, dist: core.DistributedContext) -> None:
        _name_unresponsive_ranks(exc, dist)


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

