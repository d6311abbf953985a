"""On the CPU, what the GPU tier's sync check proves on CUDA: between two boundaries the harness never
reads a value computed from a batch back into Python (``.item()``, ``.tolist()``, ``bool()``, a copy
to NumPy...), which on a GPU would wait for the device. A ``TorchFunctionMode`` follows every tensor
computed from the batch's (the loss the trial returns included; they stay plain tensors, so the loop
takes its usual paths) and refuses those reads while the harness's part of a batch runs."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from trials_pytorch import ResumeTrial, config, fit

from determined_trials import pytorch
from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")

RUN = 5  # batches between two boundaries (6 batches per epoch: runs cross an epoch's end)
FIT: dict[str, Any] = {"max_length": Batch(3 * RUN), "validation_period": Batch(RUN), "reporting_period": Batch(RUN)}
CONF = config({"global_batch_size": 4, "lr": 0.01, "hidden": 8})
READS = {"item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "cpu", "to", "nonzero"}


class _BatchReads(TorchFunctionMode):
    """Marks the tensors computed from marked ones; while ``guarding``, a read of a marked one fails."""

    def __init__(self) -> None:
        super().__init__()
        self._marked: dict[int, weakref.ref[torch.Tensor]] = {}  # id -> the tensor (ids are reused once it dies)
        self.guarding = False
        self.reads: list[str] = []

    def mark(self, *tensors: torch.Tensor) -> None:
        for tensor in tensors:
            self._marked[id(tensor)] = weakref.ref(tensor)

    def marked(self, tensor: torch.Tensor) -> bool:
        ref = self._marked.get(id(tensor))
        return ref is not None and ref() is tensor

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        inputs = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
        from_batch = any(self.marked(t) for t in inputs)
        name = getattr(func, "__name__", "")
        if self.guarding and from_batch and name in READS:
            self.reads.append(name)
            raise AssertionError(f"the harness read a batch-derived tensor back ({name}) between two boundaries")
        result = func(*args, **(kwargs or {}))
        if from_batch:
            self.mark(*(t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)))
        return result


class _Guarded(ResumeTrial):
    """Guards the span from the end of a batch that is not the last of its run to the start of the next:
    the harness's own per-batch work (metrics kept, stop checks, LR step, the next batch)."""

    def __init__(self, context: pytorch.PyTorchTrialContext, mode: _BatchReads) -> None:
        super().__init__(context)
        self.mode = mode
        self.spans = 0
        self.losses: list[torch.Tensor] = []

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.mode.guarding = False
        self.mode.mark(batch[1], batch[2])
        loss = super().train_batch(batch, epoch_idx, batch_idx)
        assert type(loss) is torch.Tensor and self.mode.marked(loss)  # a plain tensor, followed
        if (batch_idx + 1) % RUN:
            self.mode.guarding = True
            self.spans += 1
        return loss


def test_the_harness_reads_nothing_computed_from_a_batch_between_two_boundaries(tmp_path: Path) -> None:
    mode = _BatchReads()
    with mode:
        try:
            trial, trainer, info = fit(lambda ctx: _Guarded(ctx, mode), CONF, tmp_path, **FIT)
        finally:
            mode.guarding = False
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    assert trial.spans == 3 * (RUN - 1) and mode.reads == []
    assert len(info["training"]) == 3  # the losses were read, once a boundary came


def test_the_guard_catches_a_read() -> None:
    mode = _BatchReads()
    with mode:
        batch = torch.ones(2)
        mode.mark(batch)
        value = (batch * 2).sum()
        mode.guarding = True
        with pytest.raises(AssertionError, match=r"read a batch-derived tensor back \(item\)"):
            value.item()
        mode.guarding = False
        assert value.item() == 4.0
