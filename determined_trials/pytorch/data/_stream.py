"""What every training stream offers the batch loop (``TrainingBatches``, whatever it reads: a sized dataset
``_sized``, an ``IterableDataset`` ``_iterable``, the user's own loader ``_raw``) and how each one closes."""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Any, ClassVar, Protocol

__all__ = ["StreamLifecycle", "TrainingBatches", "shutdown_loader_iterator"]


class TrainingBatches(Protocol):
    """One rank's training batches, without end: ``next()`` gives the next batch, ``close()`` stops the workers.

    ``epoch_len`` is the number of batches per epoch when the data knows it. Where an epoch ends is decided
    by that length (``epochs_from_passes`` False: the loop's clock counts) or by the data's passes
    (True: a pass that runs out ends the epoch; ``epoch_idx``/``batch_in_epoch`` say where the batch that
    ``next()`` returned last lies, and the batch loop tells the clock). ``position`` counts the batches taken.
    """

    epochs_from_passes: ClassVar[bool]

    @property
    def epoch_len(self) -> int | None: ...

    @property
    def position(self) -> int: ...

    @property
    def epoch_idx(self) -> int: ...

    @property
    def batch_in_epoch(self) -> int: ...

    @property
    def loader(self) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...

    def __next__(self) -> Any: ...

    def close(self) -> None: ...


def shutdown_loader_iterator(iterator: Any) -> None:
    """Stop the worker processes of a torch DataLoader iterator now (no-op for single-process ones)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()


class StreamLifecycle:
    """``close()`` and context-manager support shared by the training streams (needs ``_iterator``)."""

    _iterator: Any
    _closed: bool

    def close(self) -> None:
        """Shut the current iterator's worker processes down (idempotent); no iteration after."""
        self._closed = True
        iterator, self._iterator = self._iterator, None
        if iterator is not None:
            shutdown_loader_iterator(iterator)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
