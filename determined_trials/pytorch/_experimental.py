"""`context.experimental`: opt-in switches (automatic AMP, raw data loaders, no auto to_device)
whose flags the trainer reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["SNAPSHOT_MIN_BYTES", "PyTorchExperimentalContext"]

SNAPSHOT_MIN_BYTES = 4 << 20  # states this large are copied and serialised off the training thread


class _AmpOwner(Protocol):
    """What the switches need of their context (the ``PyTorchTrialContext``, which imports this module)."""

    def _use_amp(self, dtype: torch.dtype | None) -> None: ...


class PyTorchExperimentalContext:
    """Experimental features of a `PyTorchTrialContext` (`context.experimental`)."""

    def __init__(self, context: _AmpOwner) -> None:
        self._context = context
        self._auto_to_device = True
        self._dataset_checks = True
        self._async_checkpoints = True
        self._snapshot_min_bytes = SNAPSHOT_MIN_BYTES

    def use_amp(self, dtype: torch.dtype | None = None) -> None:
        """Automatic mixed precision for every wrapped model, from now on.

        Forwards run under autocast with float32 outputs. The dtype follows the device unless
        `dtype` is given: on CUDA float16 with a GradScaler, as Determined's `use_amp()`; on the
        CPU bfloat16 without one (float32's range needs no loss scaling, and CPU autocast computes
        in bfloat16). So the same trial computes in float16 on a GPU and in bfloat16 on a CPU;
        pass `dtype` to pick one everywhere. With float16 the GradScaler is created (and
        checkpointed): `backward` scales the loss, `step_optimizer` unscales before clipping and
        steps through it, and the scaler is updated once after every batch that stepped. Call it
        in `__init__`. See docs/gpu.md.
        """
        self._context._use_amp(dtype)

    def disable_dataset_reproducibility_checks(self) -> None:
        """Accept data loaders that are not `det.pytorch.DataLoader` (e.g. torch's own).

        You then own their order and resume position; a finite loader that runs out ends the
        epoch.
        """
        self._dataset_checks = False

    def disable_async_checkpoints(self) -> None:
        """Write checkpoints on the training thread (by default a background thread fsyncs, publishes
        and records them; see `set_checkpoint_snapshot_threshold` for who serialises the state)."""
        self._async_checkpoints = False

    def set_checkpoint_snapshot_threshold(self, min_bytes: int) -> None:
        """How background checkpoints handle the state: one of at least `min_bytes` (models, optimizer
        state and the rest; default 4 MiB) is copied into host memory and serialised by the background
        writer; a smaller one is serialised at once on the training thread (a copy and a hand-off would
        cost more) and only fsynced, published and recorded in the background. 0: always copy."""
        if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
            raise ValueError(f"min_bytes must be an int >= 0, got {min_bytes!r}")
        self._snapshot_min_bytes = min_bytes

    def disable_auto_to_device(self) -> None:
        """Hand batches to `train_batch`/`evaluate_batch` as loaded (call `to_device` yourself)."""
        self._auto_to_device = False
