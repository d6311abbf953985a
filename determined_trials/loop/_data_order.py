"""The order of training records, framework-neutral: a seeded permutation per epoch and each rank's slice
of a global batch, computed from (seed, epoch, step) alone so any batch can be started at without loading."""

from __future__ import annotations

import warnings

import numpy as np

__all__ = [
    "derive_seed_words",
    "epoch_permutation",
    "global_epoch_len",
    "rank_bounds",
    "validate_layout",
    "warn_if_short_of_one_batch",
    "worker_seed_words",
]

_ORDER_TAG = 0x0D5E  # domain tags keep the epoch-order and worker-seed streams independent
_WORKER_TAG = 0x5EED
_MASK64 = (1 << 64) - 1


def derive_seed_words(*words: int, count: int = 4) -> np.ndarray:
    """``count`` uint32 words derived from the integers ``words`` (any sign) by numpy's SeedSequence."""
    return np.random.SeedSequence([w & _MASK64 for w in words]).generate_state(count)


def worker_seed_words(seed: int, position: int, rank: int) -> np.ndarray:
    """Seed words for the RNGs that load global batch ``position`` on ``rank``."""
    return derive_seed_words(_WORKER_TAG, seed, position, rank)


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled order of epoch ``epoch``: a function of ``(seed, epoch)`` only, never of global RNGs."""
    words = derive_seed_words(_ORDER_TAG, seed, epoch)
    return np.random.Generator(np.random.PCG64(words)).permutation(n)


def validate_layout(rank: int, num_replicas: int) -> None:
    """Reject a rank layout that cannot be sharded."""
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be an int in [0, {num_replicas}), got {rank!r}")


def global_epoch_len(n: int, per_rank: int, num_replicas: int, drop_last: bool) -> int:
    """Steps per epoch: full global batches, plus the partial one when it is kept (see ``rank_bounds``)."""
    full, rem = divmod(n, per_rank * num_replicas)
    return full + (1 if rem >= num_replicas and not drop_last else 0)


def warn_if_short_of_one_batch(n: int, per_rank: int, num_replicas: int, what: str = "the training data") -> None:
    """Warn (once per process, Python's default for one message) when ``n`` records are fewer than one
    global batch: every step would then train on a short batch, silently."""
    global_size = per_rank * num_replicas
    if 0 < n < global_size:
        warnings.warn(
            f"{what} has {n} records, fewer than one batch ({per_rank} per rank x {num_replicas} rank(s) = "
            f"{global_size}): every step trains on the same {n} records, a short batch; use a smaller "
            "global_batch_size or more data",
            stacklevel=2,
        )


def rank_bounds(step: int, n: int, per_rank: int, num_replicas: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` in the epoch order of ``rank``'s batch at in-epoch ``step``.

    A full global batch is ``per_rank * num_replicas`` consecutive indices and rank r takes the r-th
    contiguous slice; the final partial global batch is split as evenly as ``np.array_split`` would.
    """
    global_size = per_rank * num_replicas
    full = n // global_size
    if step < full:
        start = step * global_size + rank * per_rank
        return start, start + per_rank
    base, extra = divmod(n - full * global_size, num_replicas)
    start = full * global_size + rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
