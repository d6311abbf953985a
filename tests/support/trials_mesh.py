"""The trial of tests/pytorch/test_mesh.py: FSDPTrial's MLP on ``context.get_device_mesh()``: tensor parallel
(``parallelize_module`` on ``mesh["tp"]``: the first Linear column-wise, the second row-wise) when ``tp > 1``,
then ``fully_shard`` on the data-parallel mesh (HSDP: ``mesh["dp_replicate", "dp_shard"]``) when it has
several ranks; and the mistakes a mesh can hold, each caught with its message (``mesh_errors``)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from trials_fsdp import FSDPTrial, config

from determined_trials import pytorch

__all__ = ["MeshTrial", "mesh_errors", "parallelize"]


def _plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"0": ColwiseParallel(), "2": RowwiseParallel()}


def parallelize(model: nn.Sequential, mesh: Any) -> nn.Module:
    """``model`` on ``mesh`` as a user's trial would put it: the TP plan, then FSDP2 over the data-parallel ranks."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    if mesh["tp"].size() > 1:
        parallelize_module(model, mesh["tp"], _plan())
    dp = mesh["dp_replicate", "dp_shard"] if mesh["dp_replicate"].size() > 1 else mesh["dp_shard"]
    if dp.size() > 1:
        for block in (model[0], model[2], model[4]):
            fully_shard(block, mesh=dp)
        fully_shard(model, mesh=dp)
    return model


class MeshTrial(FSDPTrial):
    """FSDPTrial on the configured mesh (unsharded in one process)."""

    def build(self, shard: bool) -> nn.Module:
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
        return parallelize(model, self.context.get_device_mesh()) if shard else model


def mesh_errors(rank: int) -> dict[str, Any]:
    """Under 2 ranks: a mesh of 4 ranks, a tp of 2 that does not divide a sharded dimension (5 outputs)."""
    found: dict[str, Any] = {}
    run_dir = os.environ["DET_RUN_DIR"]
    try:
        with pytorch.init(exp_conf=config(slots=4, mesh={"tp": 2}), run_dir=run_dir):
            found["wrong_size"] = None
    except Exception as err:  # noqa: BLE001 - the test reads which error and its message
        found["wrong_size"] = f"{type(err).__name__}: {err}"
    with pytorch.init(exp_conf=config(slots=2, mesh={"tp": 2}), run_dir=run_dir) as context:
        from torch.distributed.tensor.parallel import parallelize_module

        model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 1))
        parallelize_module(model, context.get_device_mesh()["tp"], _plan())
        try:
            context.wrap_model(model)
            found["tp_divides"] = None
        except ValueError as err:
            found["tp_divides"] = str(err)
        found["mesh"] = {"names": list(context.get_device_mesh().mesh_dim_names),
                         "shape": list(context.get_device_mesh().shape)}
        torch.distributed.barrier()
    return found
