"""PyTorchCallback: hooks into a PyTorchTrial's life, with state saved in checkpoints."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["PyTorchCallback", "overrides_hook"]


def overrides_hook(callbacks: Iterable[Any], hook: str) -> bool:
    """Whether any of ``callbacks`` defines ``hook`` other than as PyTorchCallback's no-op."""
    base = getattr(PyTorchCallback, hook)
    return any(getattr(type(cb), hook, base) is not base for cb in callbacks)


class PyTorchCallback:
    """Override any hook; all are no-ops by default. Return callbacks from ``build_callbacks()``.

    Order (one rule, for every trial): on_trial_startup -> [on_checkpoint_load_start] ->
    on_training_start -> per batch: [on_training_epoch_start] -> train_batch ->
    [on_training_epoch_end] -> at each boundary: on_training_workload_end ->
    [on_validation_start -> (evaluate_batch only: on_validation_epoch_start ->
    on_validation_epoch_end) -> on_validation_end] -> [on_checkpoint_save_start ->
    on_checkpoint_end (deprecated) -> on_checkpoint_write_end (chief) -> on_checkpoint_upload_end
    (all ranks)] -> ... -> on_trial_shutdown. Callbacks run in the order ``build_callbacks()``
    returns them.
    ``state_dict`` must hold tensors, numbers, strings, lists and dicts (checkpoints load with
    ``torch.load(weights_only=True)``).
    """

    wants_batch_metrics: bool = False
    """Opt-in: set True to receive each batch's training metrics in ``on_training_workload_end``."""

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        """Before anything else; ``first_batch_idx`` > 0 when resuming."""

    def on_trial_shutdown(self) -> None:
        """Last, also after an error."""

    def on_training_start(self) -> None:
        """After the data loaders are built and any checkpoint is loaded."""

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        """Before the first batch of an epoch."""

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        """After the last batch of an epoch (before that batch's boundary processing)."""

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        """After the training metrics of a workload are reduced (every boundary), on every rank.

        ``batch_metrics`` is ``[]``: per-batch metrics are not kept on the host (that would cost a
        device sync per batch). A callback with ``wants_batch_metrics = True`` gets, as in Determined,
        one dict per batch of the workload (averaged across ranks), read back at the boundary.
        """

    def on_validation_start(self) -> None:
        """Before validation."""

    def on_validation_epoch_start(self) -> None:
        """Before the first validation batch (``evaluate_batch`` trials only)."""

    def on_validation_epoch_end(self, outputs: list[Any]) -> None:
        """After the last validation batch, with this rank's ``evaluate_batch`` outputs as returned
        (tensors stay where they are; kept only when a callback overrides this hook)."""

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        """After validation, with the reduced metrics (the same on every rank)."""

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        """Before the state in ``checkpoint`` (the loaded state_dict.pth) is restored."""

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        """Before ``checkpoint`` (the state_dict.pth contents) is written; may add entries (chief)."""

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        """Deprecated (use on_checkpoint_write_end): after the files are written (chief)."""

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        """After the checkpoint files are written, before they become visible (chief)."""

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        """After the checkpoint is stored, on every rank."""

    def state_dict(self) -> dict[str, Any]:
        """State to save with each checkpoint."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
