"""The PyTorch data chain: from a ``det.pytorch.DataLoader`` (or a plain torch one) to the reproducible
training stream and the validation shards.

Owns ``DataLoader`` (``_loader``), the plans that decide each epoch's order and each rank's share
(``_plan``), the training streams, one protocol (``_stream.TrainingBatches``) and a module per what they read:
a map-style (sized) dataset, resumed mid-epoch (``_sized``), plain torch loaders (``_raw``) and streams
(``IterableDataset``: each rank's part ``_shard``, the resumable pass-per-epoch stream over torchdata's
``StatefulDataLoader`` ``_iterable``); lengths (``_length``) and the samplers (``_samplers``, public as
``det.pytorch.samplers``). The trial's position is the loop's clock, which the streams do not write. The
DeepSpeed and Keras adapters lean on it too.

Besides torch, ``loop`` (units, ``_data_order``). Nothing else of ``pytorch``: the adapter, contexts and
trainer sit above it.

May import: errors, loop
"""

from determined_trials.pytorch.data._iterable import STREAM_POSITIONS, StreamOfPasses, StreamPositions, in_step
from determined_trials.pytorch.data._length import data_length, get_batch_length
from determined_trials.pytorch.data._loader import DataLoader, ValidationLoader, require_opt_out
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
from determined_trials.pytorch.data._sized import TrainingStream
from determined_trials.pytorch.data._stream import TrainingBatches

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
    "TrainingBatches",
    "TrainingStream",
    "ValidationLoader",
    "data_length",
    "get_batch_length",
    "in_step",
    "is_reproducible_loader",
    "require_opt_out",
    "wrap_raw_loader",
]
