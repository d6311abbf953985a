"""A PyTorchTrial's checkpoint files: what they hold and how they are written and read back.

Owns the checkpoint I/O (``_io``: ``state_dict.pth``, ``load_data.json``, RNG states, the large-state
template), the host buffers of background checkpoints (``_snapshot``) and FSDP2's sharded checkpoints
through torch.distributed.checkpoint (``_dcp``, imported only when used). The DeepSpeed adapter and
``det-trials`` use it too.

Imports ``pytorch`` only for the trial and context types; ``pytorch.parallel`` for the user's module under
DDP, ``torch.compile`` and FSDP2.

May import: _trial_context, loop, pytorch, pytorch.parallel
"""

from typing import TYPE_CHECKING, Any

from determined_trials.pytorch.checkpoint._io import (
    LOAD_DATA_FILE,
    capture_rng,
    check_model_fits,
    large_state_template,
    load_models,
    load_trial_state,
    read_state_file,
    restore_rng,
    save_trial_state,
    snapshot_trial_state,
    state_nbytes,
    tensor_shapes,
    write_load_data,
    write_trial_state,
)
from determined_trials.pytorch.checkpoint._snapshot import HostBuffers

if TYPE_CHECKING:
    from determined_trials.pytorch.checkpoint._dcp import (
        checkpoint_group,
        load_dcp_models,
        load_model_weights,
        load_sharded_state,
        read_dcp_models,
        save_sharded_state,
        start_sharded_save,
    )

# FSDP2's DCP checkpoints (``_dcp``) import torch.distributed.checkpoint: imported on first use of these names.
_DCP_NAMES = ("checkpoint_group", "load_dcp_models", "load_model_weights", "load_sharded_state", "read_dcp_models",
              "save_sharded_state", "start_sharded_save")

__all__ = [
    "HostBuffers",
    "LOAD_DATA_FILE",
    "capture_rng",
    "check_model_fits",
    "checkpoint_group",
    "large_state_template",
    "load_dcp_models",
    "load_model_weights",
    "load_models",
    "load_sharded_state",
    "load_trial_state",
    "read_dcp_models",
    "read_state_file",
    "restore_rng",
    "save_sharded_state",
    "save_trial_state",
    "snapshot_trial_state",
    "start_sharded_save",
    "state_nbytes",
    "tensor_shapes",
    "write_load_data",
    "write_trial_state",
]


def __getattr__(name: str) -> Any:
    """The DCP names, imported from ``_dcp`` on first access (``import *`` of this room imports them too)."""
    if name in _DCP_NAMES:
        from determined_trials.pytorch.checkpoint import _dcp

        return getattr(_dcp, name)
    raise AttributeError(f"module 'determined_trials.pytorch.checkpoint' has no attribute {name!r}")
