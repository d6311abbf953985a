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
