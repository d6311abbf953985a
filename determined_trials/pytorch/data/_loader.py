"""``det.pytorch.DataLoader``: a drop-in for torch's that records its settings, from which the harness builds
the reproducible training stream (seeded order, sharded global batches, skip-ahead) and validation shards."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from determined_trials.pytorch.data._iterable import StreamOfPasses, stateful_loader
from determined_trials.pytorch.data._plan import (
    BatchSamplerPlan,
    DefaultOrders,
    GroupedPlan,
    Order,
    Plan,
    SampleOrderPlan,
    SamplerOrders,
    derive_seed_words,
    validate_layout,
)
from determined_trials.pytorch.data._samplers import DistributedBatchSampler, RepeatBatchSampler, SkipBatchSampler
from determined_trials.pytorch.data._shard import is_stateful, is_stream, shard_stream
from determined_trials.pytorch.data._sized import PositionSeededDataset, StreamBatchSampler, TrainingStream
from determined_trials.pytorch.data._worker_seeds import worker_seeded

__all__ = ["DataLoader", "StreamReplayWarning", "ValidationLoader", "replay_warning", "require_opt_out"]

_GENERATOR_TAG = 0x6E4


def _seeded_generator(*words: int) -> torch.Generator:
    """A torch Generator seeded from ``words``: loaders draw their worker base seed from it, not from
    the global torch RNG."""
    return torch.Generator().manual_seed(_seed_value(*words))


def _seed_value(*words: int) -> int:
    state = derive_seed_words(_GENERATOR_TAG, *words, count=2)
    return int(state[0]) << 31 | int(state[1]) >> 1


class StreamReplayWarning(UserWarning):
    """A training stream that cannot save its position: resuming replays its epoch from the start."""


def replay_warning(dataset: Any) -> str:
    """The one warning for a stream without ``state_dict()``/``load_state_dict()``."""
    return (
        f"the training stream {type(dataset).__name__} cannot save its position (it has no state_dict() and "
        "load_state_dict()): on resume it is replayed from the start of its epoch and the batches already "
        "trained are skipped, exact but taking time proportional to the position. Define state_dict() and "
        "load_state_dict() on it (or use a datasets.IterableDataset) to resume at once"
    )


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


class ValidationLoader(torch.utils.data.DataLoader[Any]):
    """A torch DataLoader over one rank's shard of the validation data, with record counts attached:
    ``num_records`` (this rank) and ``record_counts`` (every rank, in rank order)."""

    num_records: int | None  # None for a stream
    record_counts: tuple[int, ...] | None
    _generator_seed: int

    def __iter__(self) -> Any:
        """A pass over the shard; workers get the same seeds on every pass (and after a resume)."""
        if self.generator is not None:
            self.generator.manual_seed(self._generator_seed)
        return super().__iter__()


class _FixedBatches(torch.utils.data.Sampler[list[int]]):
    """A batch sampler that yields the same index lists on every pass."""

    def __init__(self, batches: Sequence[list[int]]) -> None:
        super().__init__()
        self._batches = list(batches)

    def __len__(self) -> int:
        return len(self._batches)

    def __iter__(self) -> Iterator[list[int]]:
        return iter([list(b) for b in self._batches])


class DataLoader:
    """Drop-in for ``torch.utils.data.DataLoader`` (same arguments, same validation) over a map-style
    dataset or a stream (an ``IterableDataset``: see ``docs/data.md``). It only records its settings:
    iterating it is a plain single-process pass as torch's would be; the harness builds the reproducible
    chain from it (``build_training_stream``, ``build_validation_loader``). ``batch_size`` is the per-slot
    (per-rank) batch size.

    Reproducibility of the training chain: with the default sampler, the order of epoch e depends only
    on (trial seed, e) (``generator`` only drives ``iter(self)``). A user ``sampler`` is read one pass
    per epoch and must yield ``len(sampler)`` indices each time; a ``batch_sampler`` is dealt out
    ``num_replicas`` batches per step (a trailing group of fewer is dropped). Either is reproducible
    when its order depends only on its own state: with ``set_epoch(e)`` it is told the epoch, otherwise
    on resume the earlier epochs are re-iterated (indices only, nothing loaded) to replay its RNG; one
    that draws from the global RNG (RandomSampler without a generator) is not reproducible. In worker
    processes each batch is loaded after reseeding ``random``, ``numpy.random`` and ``torch`` from
    (seed, batch index, rank), which overrides seeding done in ``worker_init_fn``; ``in_order=False`` is
    ignored for training.
    """

    def __init__(
        self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None, sampler: Any = None,
        batch_sampler: Any = None, num_workers: int = 0, collate_fn: Any = None, pin_memory: bool = False,
        drop_last: bool = False, timeout: float = 0, worker_init_fn: Any = None,
        multiprocessing_context: Any = None, generator: torch.Generator | None = None, *,
        prefetch_factor: int | None = None, persistent_workers: bool = False, pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        if batch_size is None and batch_sampler is None:
            raise ValueError(
                "det.pytorch.DataLoader needs batches: batch_size=None (no automatic batching) is not "
                "supported; pass batch_size (e.g. context.get_per_slot_batch_size()) or a batch_sampler"
            )
        streaming = is_stream(dataset)
        if not streaming and sampler is None and batch_sampler is None and hasattr(dataset, "__len__") \
                and len(dataset) == 0:
            raise ValueError(
                f"det.pytorch.DataLoader got an empty dataset ({type(dataset).__name__} with len 0): there is "
                "nothing to train or validate on; check the data path, download or filter that builds it"
            )
        loader_args: dict[str, Any] = dict(
            num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, timeout=timeout,
            worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )
        # torch validates every argument (and resolves the defaults) exactly as it would for the user.
        self._plain = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            drop_last=drop_last, generator=generator, **loader_args,
        )
        self._loader_args = loader_args
        self._shuffle = bool(shuffle)
        self._user_sampler = sampler
        self._user_batch_sampler = batch_sampler
        self._streaming = streaming

    # -- torch-like surface -------------------------------------------------------------------------

    @property
    def dataset(self) -> Any:
        return self._plain.dataset

    @property
    def batch_size(self) -> int | None:
        """The per-slot batch size (None when a batch_sampler was given, as in torch)."""
        return self._plain.batch_size

    @property
    def shuffle(self) -> bool:
        return self._shuffle

    @property
    def drop_last(self) -> bool:
        return self._plain.drop_last

    @property
    def sampler(self) -> Any:
        return self._plain.sampler

    @property
    def batch_sampler(self) -> Any:
        return self._plain.batch_sampler

    @property
    def num_workers(self) -> int:
        return self._plain.num_workers

    @property
    def generator(self) -> torch.Generator | None:
        return self._plain.generator

    def __len__(self) -> int:
        """Batches per epoch for one process, as torch's DataLoader counts them."""
        return len(self._plain)

    def __iter__(self) -> Iterator[Any]:
        """A plain single-process pass, exactly as the equivalent torch DataLoader would give."""
        return iter(self._plain)

    def __repr__(self) -> str:
        return (f"det.pytorch.DataLoader(dataset={type(self.dataset).__name__}, batch_size={self.batch_size}, "
                f"shuffle={self._shuffle}, num_workers={self.num_workers})")

    # -- the harness's chain ------------------------------------------------------------------------

    def _plan(self, seed: int, rank: int, num_replicas: int) -> Plan:
        if self._user_batch_sampler is not None:
            return BatchSamplerPlan(self._user_batch_sampler, rank, num_replicas)
        if self._user_sampler is not None:
            _warn_about_sampler(self._user_sampler)
            source: Any = SamplerOrders(self._user_sampler)
        else:
            source = DefaultOrders(_dataset_len(self.dataset), self._shuffle, seed)
        assert self.batch_size is not None
        return SampleOrderPlan(source, self.batch_size, self.drop_last, rank, num_replicas)

    def get_data_loader(self, repeat: bool = False, skip: int = 0, num_replicas: int = 1,
                        rank: int = 0) -> torch.utils.data.DataLoader[Any]:
        """The original's chain, kept for code that calls it: torch's batches adapted by repeat, then
        round-robin sharding of whole batches, then skipping ``skip`` of this rank's batches. The
        harness itself uses ``build_training_stream``/``build_validation_loader``."""
        _check_int("skip", skip, 0)
        validate_layout(rank, num_replicas)
        batch_sampler: Any = self._plain.batch_sampler
        if repeat:
            batch_sampler = RepeatBatchSampler(batch_sampler)
        if num_replicas > 1:
            batch_sampler = DistributedBatchSampler(batch_sampler, num_replicas, rank)
        if skip > 0:
            batch_sampler = SkipBatchSampler(batch_sampler, skip)
        return torch.utils.data.DataLoader(self.dataset, batch_sampler=batch_sampler, generator=self.generator,
                                           **self._loader_args)

    def build_training_stream(
        self, *, seed: int, rank: int = 0, num_replicas: int = 1, start_batch: int = 0, group: int = 1,
    ) -> TrainingStream | StreamOfPasses:
        """The infinite training stream of ``rank`` starting at batch ``start_batch``.

        Epoch e's order is a seeded permutation of (seed, e) with ``shuffle=True``, else the dataset order
        (or the user's sampler, one pass per epoch). Each step's global batch is ``batch_size *
        num_replicas`` consecutive records of that order; rank r gets the r-th contiguous slice. The
        skipped batches are neither loaded nor indexed. With workers, the RNGs of the worker loading
        batch k are seeded from (seed, k, rank) first. With ``group`` > 1 (DeepSpeed's gradient
        accumulation) an epoch keeps only whole groups of steps (see ``GroupedPlan``).
        """
        _check_int("seed", seed, -(1 << 63))
        _check_int("start_batch", start_batch, 0)
        validate_layout(rank, num_replicas)
        _check_int("group", group, 1)
        if self._streaming:
            return self._build_stream(seed=seed, rank=rank, num_replicas=num_replicas, start_batch=start_batch,
                                      group=group)
        plan = self._plan(seed, rank, num_replicas)
        if group > 1:
            plan = GroupedPlan(plan, group)
        with_workers = self.num_workers > 0
        dataset = PositionSeededDataset(self.dataset, seed, rank) if with_workers else self.dataset
        loader = torch.utils.data.DataLoader(
            dataset, batch_sampler=StreamBatchSampler(plan, start_batch, with_workers),
            generator=_seeded_generator(seed, rank, start_batch), **{**self._loader_args, "in_order": True},
        )
        return TrainingStream(loader, plan.epoch_len, start_batch)

    @property
    def is_stream(self) -> bool:
        """Whether the dataset is a stream (an ``IterableDataset``): no length, one pass per epoch."""
        return self._streaming

    def _build_stream(self, *, seed: int, rank: int, num_replicas: int, start_batch: int,
                      group: int) -> StreamOfPasses:
        """A stream's training batches on ``rank``: its part of the stream, one pass per epoch, resumable
        through ``state_dict()`` (the caller loads the saved position before the first batch)."""
        if group > 1:
            raise ValueError(
                "a stream (IterableDataset) cannot be cut into whole groups of gradient_accumulation_steps "
                "micro-batches per epoch: DeepSpeedTrial takes map-style datasets only (see docs/data.md)"
            )
        if not is_stateful(self.dataset):
            warnings.warn(replay_warning(self.dataset), StreamReplayWarning, stacklevel=3)
        dataset = shard_stream(self.dataset, rank, num_replicas)
        loaded = worker_seeded(dataset, self.batch_size or 1) if self.num_workers > 0 else dataset
        loader = stateful_loader(loaded, batch_size=self.batch_size, drop_last=self.drop_last,
                                 generator=torch.Generator(), **{**self._loader_args, "in_order": True})
        return StreamOfPasses(loader, dataset, seed_of_epoch=lambda epoch: _seed_value(seed, rank, epoch),
                              start_batch=start_batch)

    def _validation_batches(self, seed: int) -> list[list[int]]:
        if self._user_batch_sampler is not None:
            return [list(b) for b in self._user_batch_sampler]
        if self._user_sampler is not None:
            order: Order = list(self._user_sampler)
        else:
            order = next(DefaultOrders(_dataset_len(self.dataset), self._shuffle, seed).orders(0))
        assert self.batch_size is not None
        size, n = self.batch_size, len(order)
        stop = n - n % size if self.drop_last else n
        return [[int(i) for i in order[a:min(a + size, stop)]] for a in range(0, stop, size)]

    def build_validation_loader(self, *, rank: int = 0, num_replicas: int = 1, seed: int = 0) -> ValidationLoader:
        """A torch DataLoader over ``rank``'s shard of one validation pass: the single-process batches
        (same composition as ``iter(self)`` unshuffled) split into ``num_replicas`` contiguous runs, so
        every record is visited exactly once across ranks; a rank may get fewer batches, or none."""
        validate_layout(rank, num_replicas)
        if self._streaming:  # this rank's part of one pass: its length is known only once read
            loader = ValidationLoader(shard_stream(self.dataset, rank, num_replicas), batch_size=self.batch_size,
                                      drop_last=self.drop_last, generator=torch.Generator(), **self._loader_args)
            loader.num_records, loader.record_counts = None, None
            loader._generator_seed = _seed_value(seed, rank, -1)
            return loader
        batches = self._validation_batches(seed)
        shards = np.array_split(np.arange(len(batches)), num_replicas)
        counts = tuple(sum(len(batches[b]) for b in shard) for shard in shards)
        loader = ValidationLoader(
            self.dataset, batch_sampler=_FixedBatches([batches[b] for b in shards[rank]]),
            generator=torch.Generator(), **self._loader_args,
        )
        loader.num_records, loader.record_counts = counts[rank], counts
        loader._generator_seed = _seed_value(seed, rank, -1)
        return loader


def _dataset_len(dataset: Any) -> int:
    try:
        return len(dataset)
    except TypeError:
        raise TypeError(
            f"the dataset {type(dataset).__name__} has no len(); det.pytorch.DataLoader needs a map-style "
            "dataset with __len__ (or a sampler that has one)"
        ) from None


def _warn_about_sampler(sampler: Any) -> None:
    if isinstance(sampler, torch.utils.data.DistributedSampler):
        warnings.warn(
            "the training sampler is a torch DistributedSampler, but the harness shards the data across "
            "ranks itself: each rank would only see a fraction of its share; pass a sampler over the whole "
            "dataset (or shuffle=True)",
            stacklevel=3,
        )
    if isinstance(sampler, torch.utils.data.RandomSampler) and sampler.generator is None:
        warnings.warn(
            "the training sampler is a RandomSampler without a generator: it draws from the global torch "
            "RNG, so the data order is not reproducible on resume; use shuffle=True (seeded from the trial "
            "seed) or give the sampler a seeded torch.Generator",
            stacklevel=3,
        )


def require_opt_out(loader: Any, method: str, checks_enabled: bool,
                    opt_out: str = "context.disable_dataset_reproducibility_checks()") -> None:
    """A loader that is not a ``det.pytorch.DataLoader`` needs the trial to call ``opt_out`` (how its context
    turns the dataset reproducibility checks off): a TypeError saying so while ``checks_enabled``."""
    if isinstance(loader, DataLoader) or not checks_enabled:
        return
    raise TypeError(
        f"{method}() returned a {type(loader).__module__}.{type(loader).__name__}, not a det.pytorch.DataLoader, "
        "so the harness cannot shuffle, shard and skip it reproducibly. Return det.pytorch.DataLoader(...) (same "
        f"arguments as torch's), or call {opt_out} in your trial's __init__()."
    )
