"""det.pytorch.samplers (the numbers of the original's tests) and data_length / get_batch_length."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data

from determined_trials.pytorch import samplers
from determined_trials.pytorch.samplers import data_length, get_batch_length


def batches(n: int, size: int) -> torch.utils.data.BatchSampler:
    return torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(n)), size, drop_last=False)


def test_distributed_sampler_numbers() -> None:
    shards = [samplers.DistributedSampler(range(19), num_workers=4, rank=r) for r in range(4)]
    assert [list(s) for s in shards] == [[0, 4, 8, 12, 16], [1, 5, 9, 13, 17], [2, 6, 10, 14, 18], [3, 7, 11, 15]]
    assert [len(s) for s in shards] == [5, 5, 5, 4]
    assert list(samplers.DistributedSampler(range(3), num_workers=1, rank=0)) == [0, 1, 2]


def test_distributed_batch_sampler_numbers() -> None:
    shards = [samplers.DistributedBatchSampler(batches(19, 2), num_workers=4, rank=r) for r in range(4)]
    assert [list(s) for s in shards] == [
        [[0, 1], [8, 9], [16, 17]], [[2, 3], [10, 11], [18]], [[4, 5], [12, 13]], [[6, 7], [14, 15]],
    ]
    assert [len(s) for s in shards] == [3, 3, 2, 2]


@pytest.mark.parametrize("cls", [samplers.DistributedSampler, samplers.DistributedBatchSampler])
@pytest.mark.parametrize(("workers", "rank"), [(0, 0), (2, 2), (2, -1), (True, 0), (2, 1.0)])
def test_distributed_samplers_validate(cls: Any, workers: Any, rank: Any) -> None:
    with pytest.raises(ValueError, match="num_workers|rank"):
        cls(range(4), num_workers=workers, rank=rank)


def test_skip_samplers_numbers() -> None:
    skip = samplers.SkipSampler(range(15), 5)
    assert list(skip) == list(range(5, 15)) and len(skip) == 15
    skip_batches = samplers.SkipBatchSampler(batches(15, 2), 5)
    assert list(skip_batches) == [[10, 11], [12, 13], [14]] and len(skip_batches) == 8
    assert list(samplers.SkipSampler(range(3), 10)) == []
    with pytest.raises(ValueError, match="skip"):
        samplers.SkipSampler(range(3), -1)


def test_repeat_samplers() -> None:
    repeat = samplers.RepeatSampler(range(3))
    assert list(itertools.islice(repeat, 7)) == [0, 1, 2, 0, 1, 2, 0] and len(repeat) == 3
    repeat_batches = samplers.RepeatBatchSampler(batches(5, 2))
    assert list(itertools.islice(repeat_batches, 4)) == [[0, 1], [2, 3], [4], [0, 1]] and len(repeat_batches) == 3
    with pytest.raises(RuntimeError, match="yielded nothing"):
        next(iter(samplers.RepeatSampler(range(0))))


def test_reproducible_shuffle_numbers() -> None:
    shuffle = samplers.ReproducibleShuffleSampler(range(5), seed=777)
    assert [list(shuffle), list(shuffle)] == [[0, 4, 1, 2, 3], [2, 0, 1, 3, 4]] and len(shuffle) == 5
    shuffle_batches = samplers.ReproducibleShuffleBatchSampler(batches(10, 2), seed=777)
    assert [list(shuffle_batches), list(shuffle_batches)] == [
        [[0, 1], [8, 9], [2, 3], [4, 5], [6, 7]], [[4, 5], [0, 1], [2, 3], [6, 7], [8, 9]],
    ]


def _chain(rank: int, skip: int) -> samplers.SkipBatchSampler[list[int]]:
    records = samplers.ReproducibleShuffleSampler(torch.utils.data.SequentialSampler(range(10)), seed=3)
    shard = samplers.DistributedSampler(samplers.RepeatSampler(records), num_workers=2, rank=rank)
    return samplers.SkipBatchSampler(torch.utils.data.BatchSampler(shard, 5, drop_last=False), skip)


def test_recommended_chain_resumes_exactly() -> None:
    whole = [list(itertools.islice(_chain(rank, 0), 6)) for rank in (0, 1)]
    assert [list(itertools.islice(_chain(rank, 4), 2)) for rank in (0, 1)] == [w[4:] for w in whole]
    for epoch in range(6):  # each epoch is one batch of 5 per rank, together a permutation of the records
        assert sorted(whole[0][epoch] + whole[1][epoch]) == list(range(10))
    assert whole[0][0] + whole[1][0] != whole[0][1] + whole[1][1]


def test_samplers_plug_into_a_torch_dataloader() -> None:
    batch_sampler = samplers.SkipBatchSampler(samplers.DistributedBatchSampler(batches(8, 2), 2, 1), 1)
    data: Any = range(8)
    loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(data, batch_sampler=batch_sampler)
    assert [b.tolist() for b in loader] == [[6, 7]]


def test_data_length() -> None:
    assert data_length(torch.zeros(4, 3)) == 4 and data_length(np.zeros((5, 2))) == 5
    assert data_length({"x": torch.zeros(3), "y": torch.zeros(9)}) == 3
    assert data_length((torch.zeros(6, 2), torch.zeros(1))) == 6
    assert data_length([{"a": [np.zeros(2)]}]) == 2
    assert get_batch_length is data_length
    empties: tuple[Any, ...] = ({}, [], ())
    for empty in empties:
        with pytest.raises(ValueError, match="empty"):
            data_length(empty)
    for bad in (3, "abc", torch.tensor(1.0), None):
        with pytest.raises(TypeError, match="batch length"):
            data_length(bad)
