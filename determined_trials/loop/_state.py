"""The trial's progress counters: what was trained, validated and checkpointed, as a state_dict."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["TrialState"]


@dataclasses.dataclass
class TrialState:
    """Counters the loop advances; saved with every checkpoint and restored on resume.

    ``batches_trained`` is also the position of the training data stream: resuming skips exactly
    that many global batches.
    """

    trial_id: int = 0
    batches_trained: int = 0
    epochs_trained: int = 0
    last_validation: int = 0
    last_checkpoint: int = 0
    searcher_ops_completed: int = 0

    def state_dict(self) -> dict[str, int]:
        """Plain ints, loadable with ``torch.load(weights_only=True)`` or JSON."""
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from ``state_dict()`` output; unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = set(state) - known
        if unknown:
            raise ValueError(f"unknown trial state keys {sorted(unknown)}; was the checkpoint written by another tool?")
        for key, value in state.items():
            setattr(self, key, int(value))
