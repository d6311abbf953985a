"""Models over several processes: DistributedDataParallel (``_ddp``: wrapping, no gradient sync on
the batches that only accumulate, the user's module and its plain state dict), FSDP2 models (``_fsdp``:
recognising them, their checks, DCP checkpoint folders) and the gradients FSDP2 accumulates between two
optimizer steps (``_fsdp_grads``), and the device mesh of HSDP and tensor parallel (``_mesh``: a rank's place in
it, the ``DeviceMesh``, the checks of a tensor-parallel model).

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
from determined_trials.pytorch.parallel._mesh import (
    MESH_DIMS,
    MeshLayout,
    build_device_mesh,
    check_tp_divides,
    has_dtensor_params,
)

__all__ = [
    "DCP_DIR",
    "MESH_DIMS",
    "MeshLayout",
    "apply_restored_grads",
    "build_device_mesh",
    "check_fsdp_model",
    "check_model_mix",
    "check_tp_divides",
    "has_dtensor_params",
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
