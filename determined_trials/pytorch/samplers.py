"""``det.pytorch.samplers``: the public home of the data chain's samplers (they live in ``pytorch/data/``)."""

from determined_trials.pytorch.data import (
    DistributedBatchSampler,
    DistributedSampler,
    RepeatBatchSampler,
    RepeatSampler,
    ReproducibleShuffleBatchSampler,
    ReproducibleShuffleSampler,
    SkipBatchSampler,
    SkipSampler,
    data_length,
    get_batch_length,
)

__all__ = [
    "DistributedBatchSampler",
    "DistributedSampler",
    "RepeatBatchSampler",
    "RepeatSampler",
    "ReproducibleShuffleBatchSampler",
    "ReproducibleShuffleSampler",
    "SkipBatchSampler",
    "SkipSampler",
    "data_length",
    "get_batch_length",
]
