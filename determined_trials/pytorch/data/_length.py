"""``data_length``: the number of records in a batch, the default of ``PyTorchTrial.get_batch_length``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["data_length", "get_batch_length"]


def data_length(data: Any) -> int:
    """Records in ``data``: len() of an array or tensor; of the first value of a dict, the first element
    of a list or tuple (recursively). Override ``get_batch_length`` for other batch types."""
    if isinstance(data, (np.ndarray, torch.Tensor)):
        if data.ndim == 0:
            raise TypeError("cannot take the batch length of a 0-d array or tensor; batches need a batch dimension")
        return len(data)
    if isinstance(data, Mapping):
        if not data:
            raise ValueError("cannot take the batch length of an empty dict")
        return data_length(next(iter(data.values())))
    if isinstance(data, (list, tuple)):
        if not data:
            raise ValueError(f"cannot take the batch length of an empty {type(data).__name__}")
        return data_length(data[0])
    raise TypeError(
        f"cannot take the batch length of a {type(data).__name__}: batches must be tensors, arrays, or "
        "dicts/lists/tuples of them; override PyTorchTrial.get_batch_length() for other types"
    )


get_batch_length = data_length
