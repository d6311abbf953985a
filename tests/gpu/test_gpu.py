"""The GPU tier (``make test-gpu``; skipped, and listed, without CUDA): batches from a pinned-memory
loader reach the device through non-blocking copies, with the data a pageable loader's copies bring;
the harness does not synchronise the host with the device between two batches of a run; ``fit``
leaves no CUDA memory allocated when it returns; the ``--device cuda`` benchmarks run and print their
figures. Exact resume on CUDA is in ``test_pytorch_amp_resume.py``, background checkpoints of a GPU
model in ``test_snapshot_buffers.py``, DeepSpeed on nccl in ``test_deepspeed_resume_device.py``."""

from __future__ import annotations

import gc
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support.helpers_group_run import run_in_group
from support.helpers_paths import REPO
from trials_pytorch import ResumeTrial, config, fit

from determined_trials import pytorch
from determined_trials.pytorch import Batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BENCHMARK_S = 600  # one --quick benchmark on the GPU: a few child processes that each import torch
RUN = 5  # batches between two boundaries (6 batches per epoch: runs cross an epoch's end)
FIT: dict[str, Any] = {"max_length": Batch(3 * RUN), "validation_period": Batch(RUN), "reporting_period": Batch(RUN)}
CONF = config({"global_batch_size": 4, "lr": 0.01, "hidden": 8})


def _is_cuda(device: Any) -> bool:
    """Whether ``Tensor.to``'s first argument names a CUDA device (an int is a CUDA index)."""
    if isinstance(device, int) and not isinstance(device, bool):
        return True
    return isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda"


class _Between(ResumeTrial):
    """Calls ``between(True)`` when a batch that is not the last of its run ends and ``between(False)``
    when the next begins: the span is the harness's own per-batch work (metrics kept, stop checks,
    LR scheduler, the next batch and its copy to the device), not the trial's."""

    def __init__(self, context: pytorch.PyTorchTrialContext, between: Any, run: int = RUN,
                 snapshot_threshold: int | None = None) -> None:
        super().__init__(context, pin_memory=True)
        if snapshot_threshold is not None:
            context.experimental.set_checkpoint_snapshot_threshold(snapshot_threshold)
        self.between, self.run = between, run
        self.spans = 0

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.between(False)
        loss = super().train_batch(batch, epoch_idx, batch_idx)
        if (batch_idx + 1) % self.run:
            self.between(True)
            self.spans += 1
        return loss


def test_pinned_loader_batches_arrive_by_non_blocking_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copies: list[tuple[bool, bool]] = []  # (source pinned, non_blocking) of host-to-device copies between batches
    recording = {"on": False}
    real_to = torch.Tensor.to

    def recording_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        device = args[0] if args else kwargs.get("device")
        if recording["on"] and self.device.type == "cpu" and _is_cuda(device):
            non_blocking = kwargs.get("non_blocking", args[1] if len(args) > 1 and isinstance(args[1], bool) else False)
            copies.append((self.is_pinned(), bool(non_blocking)))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    pinned, _, _ = fit(lambda ctx: _Between(ctx, lambda on: recording.update(on=on)), CONF, tmp_path / "pinned", **FIT)
    monkeypatch.setattr(torch.Tensor, "to", real_to)
    assert pinned.context.device.type == "cuda" and pinned.inputs[0].device.type == "cuda"
    assert len(copies) >= 3 * pinned.spans  # index, features and target of every batch fetched in a span
    assert all(is_pinned and non_blocking for is_pinned, non_blocking in copies), copies
    # the asynchronous copies deliver what a pageable loader's do: the same records, bitwise the same inputs
    pageable, _, _ = fit(lambda ctx: ResumeTrial(ctx), CONF, tmp_path / "pageable", **FIT)
    assert pageable.seen == pinned.seen
    for i, (a, b) in enumerate(zip(pinned.inputs, pageable.inputs)):
        assert torch.equal(a, b), f"batch {i}: the pinned loader's copy differs"


def test_no_host_device_sync_between_two_boundaries(tmp_path: Path) -> None:
    """``torch.cuda.set_sync_debug_mode("error")`` over the harness's part of every batch but a run's last:
    a ``.item()``, a blocking copy or a synchronize there raises."""
    try:
        trial, trainer, _ = fit(
            lambda ctx: _Between(ctx, lambda on: torch.cuda.set_sync_debug_mode("error" if on else "default")),
            CONF, tmp_path, **FIT,
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    assert trial.spans == 3 * (RUN - 1)


def test_no_host_device_sync_between_two_boundaries_in_a_long_run_with_background_checkpoints(tmp_path: Path) -> None:
    """The sync-debug check over 130 batches (a boundary every 10, a background checkpoint every 20, every
    state copied into host buffers): it crosses the batches during which the helper thread makes the pinned
    checkpoint buffers (after the first batch) and those in which every later checkpoint reuses them. A
    synchronising call there raises, with its traceback, and fails the fit."""
    run, batches = 10, 130
    conf = config({"global_batch_size": 4, "lr": 0.01, "hidden": 1024})
    try:
        trial, trainer, info = fit(
            lambda ctx: _Between(ctx, lambda on: torch.cuda.set_sync_debug_mode("error" if on else "default"),
                                 run=run, snapshot_threshold=0),
            conf, tmp_path, max_length=Batch(batches), reporting_period=Batch(run),
            validation_period=Batch(2 * run), checkpoint_period=Batch(2 * run),
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    assert trial.spans == batches - batches // run
    assert len(info["checkpoints"]) >= batches // (2 * run)


def _settled_allocation() -> int:
    """Bytes the caching allocator hands out once garbage is collected and cuBLAS's per-stream
    workspaces (kept by torch, not by the harness) are released."""
    gc.collect()
    torch.cuda.synchronize()
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        clear_workspaces()
    return int(torch.cuda.memory_allocated())


def test_fit_keeps_no_cuda_memory_after_it_returns(tmp_path: Path) -> None:
    def one_fit(name: str) -> None:
        trial, trainer, _ = fit(lambda ctx: ResumeTrial(ctx, amp_dtype=torch.float16), CONF, tmp_path / name, **FIT)
        assert trial.context.device.type == "cuda"
        assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"

    one_fit("warm-up")  # the CUDA context, cuBLAS handles and the allocator's first pools
    start = _settled_allocation()
    for i in range(3):
        one_fit(f"run{i}")
        assert _settled_allocation() == start, f"fit {i + 1} left CUDA memory allocated"


@pytest.mark.timeout(2 * BENCHMARK_S + 60)
def test_the_benchmarks_run_on_cuda_and_print_their_figures() -> None:
    for script, pattern in (
        ("overhead.py", r"^cuda, launch-bound .*\n(.*\n)*overhead ratio \(no ckpt\): \d+\.\d+x"),
        ("async_checkpoint.py", r"^NVIDIA.*: model \+ sgd state \d+ MB(.*\n)*last checkpoint of fit: \d+\.\d+ ms"),
    ):
        proc = run_in_group([sys.executable, str(REPO / "benchmarks" / script), "--quick", "--device", "cuda"],
                            timeout=BENCHMARK_S, cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert re.search(pattern, proc.stdout, re.MULTILINE), proc.stdout
