"""Stands in for the tutorial's MNIST download: generated images and labels of MNIST's shapes
(1x28x28 float images, normalised; int64 labels 0-9), the same for every process."""

from typing import Any

import torch

_SIZES = {True: 256, False: 128}  # small, so the test is quick


def get_dataset(data_dir: str, train: bool) -> Any:
    gen = torch.Generator().manual_seed(1 if train else 2)
    images = torch.rand(_SIZES[train], 1, 28, 28, generator=gen)
    labels = torch.randint(0, 10, (_SIZES[train],), generator=gen)
    images[torch.arange(len(labels)), 0, labels, labels] += 3.0  # a learnable hint per class
    return torch.utils.data.TensorDataset((images - 0.1307) / 0.3081, labels)
