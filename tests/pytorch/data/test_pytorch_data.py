"""det.pytorch.DataLoader and the reproducible chain: order, sharding, epochs, skip-ahead, RNGs, workers,
validation shards, raw loaders."""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import psutil
import pytest
import torch
import torch.utils.data

from determined_trials.pytorch import DataLoader
from determined_trials.pytorch.data._raw import is_reproducible_loader, wrap_raw_loader
from determined_trials.pytorch.data._sized import TrainingStream


class CountingDataset(torch.utils.data.Dataset[Any]):
    """Returns its index; records which indices were read (in this process)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reads: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.reads.append(i)
        return i


class NoisyDataset(torch.utils.data.Dataset[Any]):
    """An index plus random "augmentation" noise from torch, numpy and random."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i), torch.rand(1).item(), np.random.rand(), random.random()])


class Stream(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


def torch_loader(data: Any, **kwargs: Any) -> torch.utils.data.DataLoader[Any]:
    return torch.utils.data.DataLoader(data, **kwargs)


def take(stream: Any, count: int) -> list[list[int]]:
    return [[int(x) for x in next(stream)] for _ in range(count)]


def ranks(loader: DataLoader, replicas: int, count: int, seed: int = 3, start: int = 0) -> list[list[list[int]]]:
    streams = [loader.build_training_stream(seed=seed, rank=r, num_replicas=replicas, start_batch=start)
               for r in range(replicas)]
    return [take(s, count) for s in streams]


# -- order and sharding -------------------------------------------------------------------------------

def test_unshuffled_order_for_one_two_three_replicas() -> None:
    loader = DataLoader(CountingDataset(10), batch_size=2)
    assert ranks(loader, 1, 6) == [[[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [0, 1]]]
    assert ranks(loader, 2, 4) == [[[0, 1], [4, 5], [8], [0, 1]], [[2, 3], [6, 7], [9], [2, 3]]]
    assert ranks(loader, 3, 3) == [[[0, 1], [6, 7], [0, 1]], [[2, 3], [8], [2, 3]], [[4, 5], [9], [4, 5]]]


@pytest.mark.parametrize("replicas", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_union_of_ranks_is_the_single_process_global_batch(replicas: int, drop_last: bool) -> None:
    n, per_rank = 23, 3
    loader = DataLoader(CountingDataset(n), batch_size=per_rank, shuffle=True, drop_last=drop_last)
    single = DataLoader(CountingDataset(n), batch_size=per_rank * replicas, shuffle=True, drop_last=drop_last)
    single_stream = single.build_training_stream(seed=5)
    epoch_len = loader.build_training_stream(seed=5, num_replicas=replicas).epoch_len
    assert epoch_len == single_stream.epoch_len
    per_rank_batches = ranks(loader, replicas, 2 * epoch_len, seed=5)
    for step, expected in enumerate(take(single_stream, 2 * epoch_len)):
        parts = [per_rank_batches[r][step] for r in range(replicas)]
        assert all(parts) and sum(parts, []) == expected  # contiguous, disjoint, never empty
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_shuffled_epochs_are_seeded_permutations_independent_of_global_rng() -> None:
    loader = DataLoader(CountingDataset(12), batch_size=4, shuffle=True)
    torch.manual_seed(1)
    a = take(loader.build_training_stream(seed=7), 9)
    torch.manual_seed(2)
    np.random.seed(2)
    b = take(loader.build_training_stream(seed=7), 9)
    c = take(loader.build_training_stream(seed=8), 9)
    assert a == b and a != c
    epochs = [sum(a[e * 3:e * 3 + 3], []) for e in range(3)]
    assert all(sorted(e) == list(range(12)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]


def test_changing_replicas_keeps_the_global_order() -> None:
    loader = DataLoader(CountingDataset(24), batch_size=2, shuffle=True)
    one = sum(take(DataLoader(CountingDataset(24), batch_size=4, shuffle=True).build_training_stream(seed=9), 12), [])
    two = ranks(loader, 2, 12, seed=9)
    assert sum((two[0][s] + two[1][s] for s in range(12)), []) == one


@pytest.mark.parametrize(("n", "bs", "replicas", "drop_last", "expected"), [
    (10, 2, 1, False, 5), (10, 3, 1, False, 4), (10, 3, 1, True, 3), (10, 2, 3, False, 2),
    (10, 4, 3, False, 1), (7, 2, 3, False, 1), (7, 2, 3, True, 1), (8, 2, 3, False, 1), (9, 2, 3, False, 2),
])
def test_epoch_len(n: int, bs: int, replicas: int, drop_last: bool, expected: int) -> None:
    loader = DataLoader(CountingDataset(n), batch_size=bs, drop_last=drop_last)
    streams = [loader.build_training_stream(seed=0, rank=r, num_replicas=replicas) for r in range(replicas)]
    assert {s.epoch_len for s in streams} == {expected}
    batches = [take(s, expected) for s in streams]
    # the partial global batch is split like np.array_split, or dropped when smaller than num_replicas
    last = [len(b[-1]) for b in batches]
    assert max(last) - min(last) <= 1 and min(last) >= 1
    assert (streams[0].position, streams[0].epoch_idx, streams[0].batch_in_epoch) == (expected, 0, expected - 1)
    next(streams[0])
    assert (streams[0].epoch_idx, streams[0].batch_in_epoch) == (1, 0)


# -- skip-ahead ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_skip_ahead_equals_advancing(shuffle: bool, drop_last: bool) -> None:
    loader = DataLoader(CountingDataset(11), batch_size=2, shuffle=shuffle, drop_last=drop_last)
    for replicas in (1, 2):
        reference = ranks(loader, replicas, 20)
        epoch_len = loader.build_training_stream(seed=3, num_replicas=replicas).epoch_len
        for start in (1, epoch_len - 1, epoch_len, epoch_len + 1, 2 * epoch_len + 1):
            resumed = ranks(loader, replicas, 20 - start, start=start)
            assert [r[start:] for r in reference] == resumed


def test_skipped_samples_are_neither_loaded_nor_indexed() -> None:
    dataset = CountingDataset(10)
    stream = DataLoader(dataset, batch_size=2, shuffle=True).build_training_stream(seed=1, start_batch=7)
    reference = take(DataLoader(CountingDataset(10), batch_size=2, shuffle=True).build_training_stream(seed=1), 8)
    assert take(stream, 1) == [reference[7]]
    assert (stream.position, stream.epoch_idx, stream.batch_in_epoch) == (8, 1, 2)
    assert dataset.reads == reference[7]


# -- RNGs and workers ---------------------------------------------------------------------------------

def _rng_states() -> tuple[Any, ...]:
    return torch.random.get_rng_state(), cast(Any, np.random.get_state())[1].copy(), random.getstate()


@pytest.mark.parametrize("workers", [0, 2])
def test_global_rng_untouched(workers: int) -> None:
    torch.manual_seed(11)
    before = _rng_states()
    loader = DataLoader(CountingDataset(10), batch_size=2, shuffle=True, num_workers=workers)
    with loader.build_training_stream(seed=1) as stream:
        take(stream, 7)
    for _batch in loader.build_validation_loader(rank=0, num_replicas=2):
        pass
    after = _rng_states()
    assert torch.equal(before[0], after[0]) and (before[1] == after[1]).all() and before[2] == after[2]


def test_worker_rng_is_seeded_per_batch_position() -> None:
    loader = DataLoader(NoisyDataset(), batch_size=4, shuffle=True, num_workers=2)
    with loader.build_training_stream(seed=2, start_batch=0) as stream:
        from_zero = [next(stream) for _ in range(13)]
    with loader.build_training_stream(seed=2, start_batch=7) as stream:
        resumed = [next(stream) for _ in range(6)]
    assert all(torch.equal(a, b) for a, b in zip(from_zero[7:], resumed))
    assert len({round(float(b[0, 1]), 6) for b in from_zero}) == 13  # noise differs between batches
    with loader.build_training_stream(seed=2, rank=1, num_replicas=2, start_batch=7) as other_rank:
        assert not torch.equal(next(other_rank)[:, 1:], resumed[0][:, 1:])


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def test_no_reseeding_without_workers() -> None:
    loader = DataLoader(NoisyDataset(), batch_size=4)
    stream = loader.build_training_stream(seed=2)
    assert stream.loader.dataset is loader.dataset  # no wrapper, no per-batch cost
    _seed_all(0)
    first = next(stream)
    _seed_all(0)
    again = next(loader.build_training_stream(seed=2))
    assert torch.equal(first, again)  # the (checkpointed) global RNG drives the augmentations


def test_close_leaves_no_worker_processes() -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    stream = DataLoader(CountingDataset(10), batch_size=2, num_workers=2).build_training_stream(seed=0)
    take(stream, 3)
    assert len({p.pid for p in me.children(recursive=True)} - before) == 2
    stream.close()
    stream.close()
    assert {p.pid for p in me.children(recursive=True)} - before == set()
    with pytest.raises(RuntimeError, match="closed"):
        next(stream)


def _pair_collate(batch: list[int]) -> tuple[str, list[int]]:
    return "mine", batch


def test_loader_settings_are_honoured() -> None:
    loader = DataLoader(CountingDataset(10), batch_size=2, num_workers=1, collate_fn=_pair_collate,
                        prefetch_factor=3, persistent_workers=True, timeout=20)
    with loader.build_training_stream(seed=0, start_batch=1) as stream:
        assert next(stream) == ("mine", [2, 3])
        torch_loader = stream.loader
        assert (torch_loader.prefetch_factor, torch_loader.persistent_workers, torch_loader.timeout) == (3, True, 20)
    unordered = DataLoader(CountingDataset(10), batch_size=2, num_workers=2, in_order=False)
    with unordered.build_training_stream(seed=0) as stream:
        assert stream.loader.in_order and take(stream, 5) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert isinstance(stream, TrainingStream)


# -- user samplers ------------------------------------------------------------------------------------

class EpochAwareSampler(torch.utils.data.Sampler[int]):
    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __len__(self) -> int:
        return 6

    def __iter__(self) -> Iterator[int]:
        return iter([5, 4, 3, 2, 1, 0][self.epochs[-1] % 2:] + [5, 4, 3, 2, 1, 0][:self.epochs[-1] % 2])


def test_user_sampler_order_and_set_epoch() -> None:
    sampler = EpochAwareSampler()
    stream = DataLoader(CountingDataset(6), batch_size=2, sampler=sampler).build_training_stream(seed=0, start_batch=4)
    assert take(stream, 3) == [[2, 1], [0, 5], [5, 4]]
    assert sampler.epochs == [1, 2]


def _seeded_random_sampler() -> torch.utils.data.RandomSampler:
    return torch.utils.data.RandomSampler(range(9), generator=torch.Generator().manual_seed(4))


def test_stateful_user_sampler_is_replayed_on_skip() -> None:
    def stream(start: int) -> TrainingStream:
        loader = DataLoader(CountingDataset(9), batch_size=2, sampler=_seeded_random_sampler())
        return loader.build_training_stream(seed=0, rank=1, num_replicas=2, start_batch=start)

    reference = take(stream(0), 9)
    assert take(stream(5), 4) == reference[5:]
    with pytest.warns(UserWarning, match="global torch RNG"):
        DataLoader(CountingDataset(9), sampler=torch.utils.data.RandomSampler(range(9))).build_training_stream(seed=0)


def test_user_batch_sampler_is_dealt_to_ranks() -> None:
    batches = [[0], [1, 2], [3, 4, 5], [6], [7, 8], [9]]  # 6 batches, 4 ranks: the trailing 2 are dropped
    loader = DataLoader(CountingDataset(10), batch_sampler=batches)
    streams = [loader.build_training_stream(seed=0, rank=r, num_replicas=4) for r in range(4)]
    assert [s.epoch_len for s in streams] == [1] * 4
    assert [take(s, 2) for s in streams] == [[[0], [0]], [[1, 2], [1, 2]], [[3, 4, 5], [3, 4, 5]], [[6], [6]]]
    two = [loader.build_training_stream(seed=0, rank=r, num_replicas=2, start_batch=2) for r in range(2)]
    assert [take(s, 2) for s in two] == [[[7, 8], [0]], [[9], [1, 2]]]


class LyingSampler(torch.utils.data.Sampler[int]):
    def __len__(self) -> int:
        return 8

    def __iter__(self) -> Iterator[int]:
        return iter(range(5))


def test_sampler_warnings_and_too_few_batches() -> None:
    dataset = CountingDataset(8)
    with pytest.warns(UserWarning, match="shards the data"):
        sampler: Any = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=0)
        DataLoader(dataset, batch_size=2, sampler=sampler).build_training_stream(seed=0)
    with pytest.raises(ValueError, match="3 batches from its batch_sampler"):
        DataLoader(dataset, batch_sampler=[[0], [1], [2]]).build_training_stream(seed=0, num_replicas=4)


def test_sampler_shorter_than_its_len_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="yielded 5 indices"):
        next(DataLoader(CountingDataset(8), batch_size=2, sampler=LyingSampler()).build_training_stream(seed=0))
    with pytest.raises(RuntimeError, match="yielded 2 batches"):
        batch_sampler = torch.utils.data.BatchSampler(LyingSampler(), 3, False)
        take(DataLoader(CountingDataset(8), batch_sampler=batch_sampler).build_training_stream(seed=0), 3)


# -- validation ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("replicas", [1, 2, 3, 5])
def test_validation_visits_each_record_once(replicas: int) -> None:
    loader = DataLoader(CountingDataset(10), batch_size=3, num_workers=0)
    shards = [loader.build_validation_loader(rank=r, num_replicas=replicas) for r in range(replicas)]
    seen = [[int(i) for batch in shard for i in batch] for shard in shards]
    assert sorted(sum(seen, [])) == list(range(10))
    assert [s.num_records for s in shards] == [len(x) for x in seen] == list(shards[0].record_counts)
    assert [[int(i) for i in b] for s in shards for b in s] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert [[int(i) for batch in shard for i in batch] for shard in shards] == seen  # re-iterable


def test_validation_drop_last_shuffle_and_workers() -> None:
    assert DataLoader(CountingDataset(10), batch_size=3, drop_last=True).build_validation_loader().num_records == 9
    shuffled = DataLoader(CountingDataset(10), batch_size=4, shuffle=True, num_workers=2)
    loader = shuffled.build_validation_loader(rank=1, num_replicas=2, seed=3)
    passes = [[int(i) for b in loader for i in b] for _ in range(2)]
    assert passes[0] == passes[1] and len(passes[0]) == 2


# -- constructor --------------------------------------------------------------------------------------

def test_constructor_is_a_torch_drop_in() -> None:
    loader = DataLoader(CountingDataset(10), batch_size=3)
    assert len(loader) == 4 and [b.tolist() for b in loader][-1] == [9]
    assert (loader.batch_size, loader.drop_last, loader.shuffle, loader.num_workers) == (3, False, False, 0)
    assert isinstance(loader.sampler, torch.utils.data.SequentialSampler)
    assert len(DataLoader(CountingDataset(10), batch_size=3, drop_last=True)) == 3
    assert DataLoader(CountingDataset(10), batch_sampler=[[1, 2]]).batch_size is None
    assert is_reproducible_loader(loader) and not is_reproducible_loader(torch_loader(range(3)))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_size": None}, "batch_size=None"),
    ({"shuffle": True, "sampler": [0, 1]}, "mutually exclusive"),
    ({"batch_sampler": [[0]], "batch_size": 2}, "mutually exclusive"),
    ({"num_workers": -1}, "num_workers"),
    ({"persistent_workers": True}, "persistent_workers"),
    ({"prefetch_factor": 2}, "prefetch_factor"),
    ({"timeout": -1}, "timeout"),
])
def test_bad_constructor_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DataLoader(CountingDataset(4), **kwargs)


def test_original_get_data_loader_chain() -> None:
    loader = DataLoader(CountingDataset(10), batch_size=2)
    expected = [[[2, 3], [8, 9], [4, 5], [0, 1], [6, 7]], [[4, 5], [0, 1], [6, 7], [2, 3], [8, 9]],
                [[6, 7], [2, 3], [8, 9], [4, 5], [0, 1]]]
    for rank in range(3):
        chain = iter(loader.get_data_loader(repeat=True, skip=2, num_replicas=3, rank=rank))
        assert [next(chain).tolist() for _ in range(5)] == expected[rank]
    assert [b.tolist() for b in loader.get_data_loader(num_replicas=3, rank=2)] == [[4, 5]]


def test_iterable_dataset_is_taken_as_a_stream_with_torch_checks() -> None:
    assert DataLoader(Stream(), batch_size=2).is_stream  # streams: tests/pytorch/data/test_pytorch_streams.py
    with pytest.raises(ValueError, match="shuffle"):  # torch's own refusal, as for its DataLoader
        DataLoader(Stream(), batch_size=2, shuffle=True)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"seed": 0, "rank": 2, "num_replicas": 2}, ValueError, "rank"),
    ({"seed": 0, "num_replicas": 0}, ValueError, "num_replicas"),
    ({"seed": 0, "start_batch": -1}, ValueError, "start_batch"),
    ({"seed": 0.5}, ValueError, "seed"),
    ({"seed": 0, "num_replicas": 5}, ValueError, "too few"),
])
def test_bad_stream_arguments(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        DataLoader(CountingDataset(4), batch_size=2, drop_last=True).build_training_stream(**kwargs)


def test_training_data_smaller_than_one_batch_warns_once() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(2):  # e.g. a restart in the same process: said once
            stream = DataLoader(CountingDataset(3), batch_size=4).build_training_stream(seed=0, num_replicas=2)
            assert stream.epoch_len == 1
        DataLoader(CountingDataset(8), batch_size=4).build_training_stream(seed=0, num_replicas=2)  # whole
        DataLoader(CountingDataset(3), batch_size=4).build_validation_loader()  # validation: short is fine
    messages = [str(w.message) for w in caught]
    assert messages == ["the training data has 3 records, fewer than one batch (4 per rank x 2 rank(s) = 8): every "
                        "step trains on the same 3 records, a short batch; use a smaller global_batch_size or more "
                        "data"]


# -- raw loaders --------------------------------------------------------------------------------------

@pytest.mark.timeout(20)
def test_raw_finite_loader_is_re_iterated_per_epoch() -> None:
    stream = wrap_raw_loader(torch_loader(range(6), batch_size=2))
    assert stream.epoch_len == 3
    seen = []
    for _ in range(7):
        batch = next(stream).tolist()
        seen.append((stream.epoch_idx, stream.batch_in_epoch, batch))
    assert seen[2:5] == [(0, 2, [4, 5]), (1, 0, [0, 1]), (1, 1, [2, 3])] and stream.position == 7


class SkippedOnce:
    """A loader whose first pass is empty (as if the user skipped all of it) and later ones are not."""

    def __init__(self) -> None:
        self.passes = 0

    def __len__(self) -> int:
        return 2

    def __iter__(self) -> Iterator[list[int]]:
        self.passes += 1
        return iter([] if self.passes == 1 else [[1], [2]])


class ShortPasses(SkippedOnce):
    def __len__(self) -> int:
        return 3

    def __iter__(self) -> Iterator[list[int]]:
        return iter([[1], [2]])


@pytest.mark.timeout(20)
def test_raw_exhausted_or_empty_loader_raises_instead_of_hanging() -> None:
    one_shot = wrap_raw_loader(iter([1, 2]))
    assert [next(one_shot), next(one_shot)] == [1, 2] and one_shot.epoch_len is None
    with pytest.raises(RuntimeError, match="one-shot iterator"):
        next(one_shot)
    with pytest.raises(RuntimeError, match="no batch in a whole pass"):
        next(wrap_raw_loader(torch_loader([], batch_size=2)))
    resumed = wrap_raw_loader(SkippedOnce(), start_batch=2)  # the user skipped to a pass end: allowed once
    assert (next(resumed), resumed.position, resumed.epoch_idx, resumed.batch_in_epoch) == ([1], 3, 1, 0)
    short = wrap_raw_loader(ShortPasses())  # len() says 3, passes hold 2: running out ends the epoch
    assert [(next(short), short.epoch_idx, short.batch_in_epoch) for _ in range(3)] == [
        ([1], 0, 0), ([2], 0, 1), ([1], 1, 0)]
    with pytest.raises(TypeError, match="iterable"):
        wrap_raw_loader(42)
    with pytest.raises(ValueError, match="start_batch"):
        wrap_raw_loader([[1]], start_batch=-2)


@pytest.mark.timeout(30)
def test_raw_loader_with_workers_is_closed() -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    stream = wrap_raw_loader(torch_loader(range(8), batch_size=2, num_workers=2))
    assert [next(stream).tolist() for _ in range(5)][-1] == [0, 1]
    stream.close()
    assert {p.pid for p in me.children(recursive=True)} - before == set()
