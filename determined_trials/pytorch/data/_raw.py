"""Raw training loaders (after ``disable_dataset_reproducibility_checks()``): iterate the user's loader as
it is, one pass per epoch, and fail loudly on a pass without batches instead of spinning forever."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any, ClassVar

from determined_trials.pytorch.data._stream import StreamLifecycle, shutdown_loader_iterator

__all__ = ["RawLoaderStream", "is_reproducible_loader", "wrap_raw_loader"]


def is_reproducible_loader(obj: Any) -> bool:
    """True for a ``det.pytorch.DataLoader`` (the harness builds the reproducible chain from it)."""
    from determined_trials.pytorch.data._loader import DataLoader

    return isinstance(obj, DataLoader)


class RawLoaderStream(StreamLifecycle):
    """The user's loader as a stream of training batches: when a pass ends, the next epoch starts a new
    pass (``iter(loader)`` again). Nothing is repeated, sharded or skipped here: on resume, skipping the
    batches already trained is the user's job (start at ``context.get_initial_batch()``).

    Each pass is an epoch: ``epoch_idx``/``batch_in_epoch`` locate the batch ``next()`` returned last,
    counting from ``start_batch`` (with ``epoch_len = len(loader)`` when the loader has a len, else None);
    a pass that runs out ends the epoch, whatever its len said. A pass that yields no batch at all raises
    RuntimeError (a one-shot iterator that ran out, or an empty loader) instead of waiting forever.
    """

    epochs_from_passes: ClassVar[bool] = True

    def __init__(self, loader: Any, start_batch: int = 0) -> None:
        if not isinstance(loader, Iterable):
            raise TypeError(f"the training data loader must be iterable, got {type(loader).__name__}")
        self.epoch_len: int | None = len(loader) if isinstance(loader, Sized) else None
        self._loader = loader
        self._iterator: Iterator[Any] | None = None
        self._pass_batches = 0
        self._closed = False
        self.position = start_batch
        self._next_epoch, self._next_in_epoch = divmod(start_batch, self.epoch_len) if self.epoch_len else (0, 0)
        self.epoch_idx, self.batch_in_epoch = self._next_epoch, self._next_in_epoch - 1
        self._allow_empty_pass = start_batch > 0  # the user may have skipped to the end of a pass

    @property
    def loader(self) -> Any:
        """The user's loader."""
        return self._loader

    def __iter__(self) -> RawLoaderStream:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise RuntimeError("this training stream was closed; build a new one to keep training")
        for _attempt in range(2):
            if self._iterator is None:
                self._iterator = iter(self._loader)
                self._pass_batches = 0
            try:
                batch = next(self._iterator)
            except StopIteration:
                self._end_pass()
                continue
            self._pass_batches += 1
            self.position += 1
            self.epoch_idx, self.batch_in_epoch = self._next_epoch, self._next_in_epoch
            self._next_in_epoch += 1
            self._allow_empty_pass = False
            return batch
        raise AssertionError("unreachable")  # pragma: no cover - _end_pass raises on the second empty pass

    def _end_pass(self) -> None:
        empty = self._pass_batches == 0
        shutdown_loader_iterator(self._iterator)
        self._iterator = None
        if self._next_in_epoch > 0:  # a resumed pass that was skipped to its end starts no new epoch
            self._next_epoch, self._next_in_epoch = self._next_epoch + 1, 0
        if empty and not self._allow_empty_pass:
            one_shot = isinstance(self._loader, Iterator)
            raise RuntimeError(
                f"the training data loader ({type(self._loader).__name__}) yielded no batch in a whole pass"
                + (": it is a one-shot iterator that is exhausted; return a re-iterable loader "
                   "(e.g. a torch.utils.data.DataLoader)" if one_shot else
                   ": it is empty; check the dataset and batch size")
                + " (training would otherwise wait forever)"
            )
        self._allow_empty_pass = False


def wrap_raw_loader(loader: Any, *, start_batch: int = 0) -> RawLoaderStream:
    """A training stream over a raw loader; ``start_batch`` only sets the counters (no skipping)."""
    if isinstance(start_batch, bool) or not isinstance(start_batch, int) or start_batch < 0:
        raise ValueError(f"start_batch must be an int >= 0, got {start_batch!r}")
    return RawLoaderStream(loader, start_batch)
