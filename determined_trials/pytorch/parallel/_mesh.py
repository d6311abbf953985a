"""A PyTorchTrial's 2-D (3-named-dimension) device mesh: where a rank sits in it (its data-parallel
coordinates and tensor-parallel rank), the ``DeviceMesh`` itself, and the checks of a tensor-parallel
model (DTensor parameters: no DDP, and ``tp`` must divide every dimension the plan shards)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MESH_DIMS", "MeshLayout", "build_device_mesh", "check_tp_divides", "has_dtensor_params"]

MESH_DIMS = ("dp_replicate", "dp_shard", "tp")  # the dimension names of every mesh, outermost first


@dataclass(frozen=True)
class MeshLayout:
    """The mesh's sizes and this rank's place in it; ranks are laid out row-major over ``MESH_DIMS``, so the
    ``tp`` ranks of one data-parallel group are neighbours (``rank = dp_rank * tp + tp_rank``)."""

    dp_replicate: int
    dp_shard: int
    tp: int
    rank: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.dp_replicate, self.dp_shard, self.tp

    @property
    def size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp_size(self) -> int:
        """The data-parallel ranks: each reads its own part of the data."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel group: the ranks of one group read the same batches."""
        return self.rank // self.tp

    @property
    def reports(self) -> bool:
        """Whether this rank's metrics count (one rank per tensor-parallel group: ``tp`` rank 0)."""
        return self.rank % self.tp == 0


def build_device_mesh(layout: MeshLayout, device: torch.device) -> Any:
    """The ``DeviceMesh`` of ``layout`` over the default process group, dimensions named ``MESH_DIMS``."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, layout.shape, mesh_dim_names=MESH_DIMS)


def _dtensor_class() -> type | None:
    import sys

    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def has_dtensor_params(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds DTensor parameters (a tensor-parallel plan or ``fully_shard`` applied)."""
    cls = _dtensor_class()
    return cls is not None and any(isinstance(p, cls) for p in model.parameters())


def check_tp_divides(model: torch.nn.Module) -> None:
    """Raise when a parameter is sharded over the ``tp`` dimension unevenly: its sharded dimension does not
    divide by the ``tp`` size (the ranks would hold shards of different sizes, and resharding on resume
    would move records between them)."""
    if _dtensor_class() is None:
        return
    from torch.distributed.tensor import DTensor, Shard  # imported already (the model holds DTensors)

    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            continue
        mesh = param.device_mesh
        names = mesh.mesh_dim_names or ()
        for i, placement in enumerate(param.placements):
            if i < len(names) and names[i] == "tp" and isinstance(placement, Shard):
                size, dim = mesh.size(i), placement.dim
                if param.shape[dim] % size:
                    raise ValueError(
                        f"the tensor-parallel plan shards parameter {name!r} (shape {tuple(param.shape)}) along "
                        f"dimension {dim} ({param.shape[dim]}) over tp={size} ranks, which does not divide it. "
                        f"Fix: choose a tp that divides {param.shape[dim]} (resources.mesh.tp), or change the plan"
                    )
