"""scikit-learn's digits served as a stream: a torch ``IterableDataset`` that reads its records in a seeded order
per epoch, splits them between ranks and data-loader workers, and saves its position (``state_dict``), so that a
stopped run goes on at the exact record it would have read next."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def digits_split(split: str) -> tuple[np.ndarray, np.ndarray]:
    """The images (pixels scaled to [0, 1], 64 per image) and labels of ``split``: "train" (1437) or
    "validation" (360), the same fixed 80/20 split as examples/digits_pytorch."""
    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x / 16.0, y, test_size=0.2, random_state=0)
    return (x_train, y_train) if split == "train" else (x_val, y_val)


class DigitsStream(torch.utils.data.IterableDataset[dict[str, Any]]):
    """Records ``{"image": 64 floats, "label": digit, "index": the record's row in the split}``, one pass per epoch.

    ``shuffle_seed`` set: each epoch reads the split in its own permutation of (seed, epoch), told by the harness
    through ``set_epoch``; None: in the split's order. A pass is split record by record: with R readers (ranks ×
    data-loader workers) reader j reads the records j, j + R, ... of the pass. The position (``state_dict``) is
    the epoch and the next record of the pass; a loaded position is taken up by the next pass."""

    def __init__(self, split: str, shuffle_seed: int | None = None) -> None:
        images, labels = digits_split(split)
        self.images = torch.tensor(images, dtype=torch.float32)
        self.labels = torch.tensor(labels, dtype=torch.long)
        self.shuffle_seed = shuffle_seed
        self.epoch, self.next_record = 0, 0
        self.rank, self.world_size = 0, 1
        self._loaded = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_shard(self, rank: int, world_size: int) -> None:
        """This rank's part of every pass (the harness calls it on several ranks)."""
        self.rank, self.world_size = rank, world_size

    def order(self) -> torch.Tensor:
        """The rows of the split in the current epoch's order."""
        if self.shuffle_seed is None:
            return torch.arange(len(self.labels))
        generator = torch.Generator().manual_seed(self.shuffle_seed * 1_000_003 + self.epoch)
        return torch.randperm(len(self.labels), generator=generator)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self._loaded:  # a new pass starts at its first record; a loaded position is taken up once
            self.next_record = 0
        self._loaded = False
        return self._records(self.order())

    def _records(self, order: torch.Tensor) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        readers, me = self.world_size * workers, self.rank * workers + worker
        while self.next_record < len(order):
            position = self.next_record
            self.next_record += 1
            if position % readers == me:
                row = int(order[position])
                yield {"image": self.images[row], "label": self.labels[row], "index": row}

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "next_record": self.next_record}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.next_record, self._loaded = state["epoch"], state["next_record"], True
