"""The PyTorch data chain: from a ``det.pytorch.DataLoader`` (or a plain torch one) to the reproducible
training stream and the validation shards.

Owns ``DataLoader`` (``_loader``), the plans that decide each epoch's order and each rank's share
(``_plan``), the training stream that resumes mid-epoch (``_stream``), plain torch loaders (``_raw``),
lengths (``_length``), the trial's position in the data (``_position``), the samplers (``_samplers``,
public as ``det.pytorch.samplers``) and streams (``IterableDataset``): each rank's part (``_shard``) and the
resumable pass-per-epoch stream over torchdata's ``StatefulDataLoader`` (``_iterable``). The DeepSpeed and
Keras adapters lean on it too.

Besides torch, ``loop`` (units, ``_data_order``). Nothing else of ``pytorch``: the adapter, contexts and
trainer sit above it.

May import: errors, loop
"""

from determined_trials.pytorch.data._iterable import STREAM_POSITIONS, StreamOfPasses, StreamPositions, in_step
from determined_trials.pytorch.data._length import data_length, get_batch_length
from determined_trials.pytorch.data._loader import DataLoader, require_opt_out
from determined_trials.pytorch.data._position import TrainPosition
from determined_trials.pytorch.data._raw import is_reproducible_loader, wrap_raw_loader
from determined_trials.pytorch.data._samplers import (
    DistributedBatchSampler,
    DistributedSampler,
    RepeatBatchSampler,
    RepeatSampler,
    ReproducibleShuffleBatchSampler,
    ReproducibleShuffleSampler,
    SkipBatchSampler,
    SkipSampler,
)
from determined_trials.pytorch.data._stream import TrainingStream

__all__ = [
    "DataLoader",
    "DistributedBatchSampler",
    "DistributedSampler",
    "RepeatBatchSampler",
    "RepeatSampler",
    "ReproducibleShuffleBatchSampler",
    "ReproducibleShuffleSampler",
    "STREAM_POSITIONS",
    "SkipBatchSampler",
    "SkipSampler",
    "StreamOfPasses",
    "StreamPositions",
    "TrainPosition",
    "TrainingStream",
    "data_length",
    "get_batch_length",
    "in_step",
    "is_reproducible_loader",
    "require_opt_out",
    "wrap_raw_loader",
]
