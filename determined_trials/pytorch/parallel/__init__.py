"""Models over several processes: DistributedDataParallel (``_ddp``: wrapping, no gradient sync on
the batches that only accumulate, the user's module and its plain state dict), FSDP2 models (``_fsdp``:
recognising them, their checks, DCP checkpoint folders) and the gradients FSDP2 accumulates between two
optimizer steps (``_fsdp_grads``).

Only torch.

May import: nothing
"""

from determined_trials.pytorch.parallel._ddp import (
    plain_module,
    plain_state_dict,
    set_grad_sync,
    torch_distributed_ready,
    unwrap,
    wrap_ddp,
)
from determined_trials.pytorch.parallel._fsdp import (
    DCP_DIR,
    check_fsdp_model,
    check_model_mix,
    is_dcp_checkpoint,
    is_fsdp,
    set_fsdp_grad_sync,
)
from determined_trials.pytorch.parallel._fsdp_grads import apply_restored_grads, pending_fsdp_grads, restore_fsdp_grads

__all__ = [
    "DCP_DIR",
    "apply_restored_grads",
    "check_fsdp_model",
    "check_model_mix",
    "is_dcp_checkpoint",
    "is_fsdp",
    "pending_fsdp_grads",
    "plain_module",
    "plain_state_dict",
    "restore_fsdp_grads",
    "set_fsdp_grad_sync",
    "set_grad_sync",
    "torch_distributed_ready",
    "unwrap",
    "wrap_ddp",
]
