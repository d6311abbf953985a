"""``ModelParallelUnit``: which data-parallel slice a rank is, whether it builds data loaders and
whether its metrics count; the default (pure data parallelism) and the one of a pipeline grid."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["ModelParallelUnit", "make_data_parallel_mpu", "make_deepspeed_mpu"]


@dataclasses.dataclass
class ModelParallelUnit:
    """Data-parallel rank and size of this process, and its roles (subclass it for custom parallelism)."""

    data_parallel_rank: int
    data_parallel_world_size: int
    should_report_metrics: bool
    should_build_data_loader: bool

    def __post_init__(self) -> None:
        for name in ("data_parallel_rank", "data_parallel_world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"ModelParallelUnit.{name} must be an int, got {value!r}")
        if not 0 <= self.data_parallel_rank < self.data_parallel_world_size:
            raise ValueError(f"ModelParallelUnit: data_parallel_rank {self.data_parallel_rank} is not in "
                             f"[0, data_parallel_world_size={self.data_parallel_world_size})")


def make_data_parallel_mpu(rank: int, size: int) -> ModelParallelUnit:
    """Every rank is its own data-parallel slice, builds loaders and reports metrics."""
    return ModelParallelUnit(rank, size, True, True)


def make_deepspeed_mpu(grid: Any) -> ModelParallelUnit:
    """From a DeepSpeed ``PipelineParallelGrid``: loaders on slice rank 0 of the first and last stages
    (the stages that read inputs and labels); metrics from the last stage (the one with the loss)."""
    stage, stages = grid.get_stage_id(), grid.get_pipe_parallel_world_size()
    is_edge = stage in (0, stages - 1)
    return ModelParallelUnit(
        data_parallel_rank=grid.get_data_parallel_rank(),
        data_parallel_world_size=grid.get_data_parallel_world_size(),
        should_report_metrics=stage == stages - 1 and grid.get_slice_parallel_rank() == 0,
        should_build_data_loader=is_edge and grid.get_slice_parallel_rank() == 0,
    )
