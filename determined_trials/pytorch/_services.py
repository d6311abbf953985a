"""What every torch-based trial context offers besides wrapping: the stop flag, the initial batch,
TensorBoard (folder, lazy writer, metric-logging switch) and the profiler (PyTorch and DeepSpeed)."""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from determined_trials.pytorch._tensorboard import make_profiler, make_summary_writer

if TYPE_CHECKING:
    from determined_trials.core import Context

__all__ = ["TrialServices"]

logger = logging.getLogger("determined_trials.pytorch")


class TrialServices:
    """Mixin of the PyTorch and DeepSpeed trial contexts; ``_init_services`` sets its fields."""

    _core: Context | None

    def _init_services(self, core_context: Context | None, enable_tensorboard_logging: bool,
                       initial_batch: int) -> None:
        self._core = core_context
        self.set_enable_tensorboard_logging(enable_tensorboard_logging)
        self._stop_requested = False
        self._initial_batch = initial_batch
        self._tb_writer: Any = None
        self._tb_fallback: Path | None = None
        self._profiler: torch.profiler.profile | None = None

    def set_stop_requested(self, stop_requested: bool) -> None:
        """Ask the trainer to stop (with a checkpoint) at the end of the current batch."""
        if not isinstance(stop_requested, bool):
            raise TypeError(f"set_stop_requested takes True or False, got {stop_requested!r}")
        self._stop_requested = stop_requested

    def get_stop_requested(self) -> bool:
        """Whether a stop was requested with `set_stop_requested(True)`."""
        return self._stop_requested

    def get_initial_batch(self) -> int:
        """The number of batches trained before this run started (non-zero when resuming)."""
        return self._initial_batch

    def get_enable_tensorboard_logging(self) -> bool:
        """Whether the trainer writes reported metrics to TensorBoard."""
        return self._enable_tensorboard_logging

    def set_enable_tensorboard_logging(self, enable_tensorboard_logging: bool) -> None:
        """Turn the trainer's TensorBoard metric logging on or off."""
        if not isinstance(enable_tensorboard_logging, bool):
            raise TypeError(f"enable_tensorboard_logging must be True or False, got {enable_tensorboard_logging!r}")
        self._enable_tensorboard_logging = enable_tensorboard_logging

    def get_tensorboard_path(self) -> Path:
        """The folder for this process's TensorBoard files."""
        if self._core is not None:
            return Path(self._core.train.get_tensorboard_path())
        if self._tb_fallback is None:
            self._tb_fallback = Path(tempfile.mkdtemp(prefix="det-trials-tensorboard-"))
            logger.info("no Core API context: TensorBoard files go to %s", self._tb_fallback)
        return self._tb_fallback

    def get_tensorboard_writer(self) -> Any:
        """A `torch.utils.tensorboard.SummaryWriter` in the trial's TensorBoard folder (created on
        first use; closed by the trainer at the end)."""
        if self._tb_writer is None:
            self._tb_writer = make_summary_writer(self.get_tensorboard_path())
        return self._tb_writer

    def set_profiler(self, *args: Any, **kwargs: Any) -> None:
        """Profile training with `torch.profiler.profile(*args, **kwargs)`; traces go to the
        TensorBoard folder. The trainer enters it before training and steps it every batch."""
        profiler = make_profiler(self.get_tensorboard_path(), args, kwargs)
        if self._profiler is not None:
            warnings.warn("set_profiler() called again: the new profiler replaces the first", stacklevel=2)
        self._profiler = profiler

    def _close(self) -> None:
        """Trainer hook at shutdown: flush and close the SummaryWriter."""
        if self._tb_writer is not None:
            self._tb_writer.close()
            self._tb_writer = None
