"""The language model's data: the Python standard library's own sources (they ship with every Python), a
byte-level tokenizer, and the stream of fixed-length token blocks built with Hugging Face ``datasets`` in
streaming mode. Nothing is downloaded."""

from __future__ import annotations

import os
import random
import sysconfig
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: nothing reaches the network
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

EOS = 256  # ends every file; byte values are 0-255
VOCAB_SIZE = 257
VALIDATION_EVERY = 10  # every 10th file of the fixed order is held out for validation
_DOCUMENTS_PER_MAP_BATCH = 8  # files concatenated before cutting blocks (the tail of each group is dropped)


def encode(text: str) -> list[int]:
    """Byte-level tokens: the UTF-8 bytes of ``text``, then ``EOS``."""
    return [*text.encode("utf-8"), EOS]


def decode(tokens: list[int]) -> str:
    """The text of byte tokens (``EOS`` and anything above a byte dropped; broken UTF-8 replaced)."""
    return bytes(t for t in tokens if 0 <= t < 256).decode("utf-8", errors="replace")


def source_files(split: str) -> list[str]:
    """The corpus's files for ``split`` ("train" or "validation"): the standard library's top-level public
    modules (``*.py`` not starting with ``_``), sorted by name, then shuffled once with a fixed seed so
    topics mix; every ``VALIDATION_EVERY``-th file is held out for validation."""
    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(path) for path in stdlib.glob("*.py") if not path.name.startswith("_"))
    if not files:
        raise FileNotFoundError(f"no Python sources under {stdlib}: this example reads the standard library's")
    random.Random(0).shuffle(files)
    held_out = split == "validation"
    return [f for i, f in enumerate(files) if (i % VALIDATION_EVERY == VALIDATION_EVERY - 1) == held_out]


def _pack(block_size: int) -> Any:
    """A batched ``map`` function: the files' tokens concatenated and cut into ``block_size`` blocks."""

    def pack(documents: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        tokens = [t for text in documents["text"] for t in encode(text)]
        usable = len(tokens) - len(tokens) % block_size
        return {"input_ids": [tokens[i:i + block_size] for i in range(0, usable, block_size)]}

    return pack


def blocks(split: str, block_size: int, limit: int | None = None) -> Any:
    """A ``datasets.IterableDataset`` (streaming: files are read as they are needed) of ``{"input_ids":
    [block_size tokens]}``, one shard per file; ``limit``: only the first ``limit`` blocks."""
    import datasets

    files = source_files(split)
    stream = datasets.load_dataset("text", data_files={split: files}, split=split, streaming=True,
                                   sample_by="document")
    stream = stream.map(_pack(block_size), batched=True, batch_size=_DOCUMENTS_PER_MAP_BATCH,
                        remove_columns=["text"])
    return stream if limit is None else stream.take(limit)


def collate(examples: list[dict[str, list[int]]]) -> torch.Tensor:
    """A batch of blocks as one ``(batch, block_size)`` int64 tensor."""
    return torch.tensor([example["input_ids"] for example in examples], dtype=torch.long)
