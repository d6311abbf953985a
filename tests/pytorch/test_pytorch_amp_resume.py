"""Exact resume on each device, in float32 and under ``use_amp`` (bfloat16 autocast; float16 with the
harness's GradScaler), with and without ``torch.compile``: a run stopped mid-epoch and resumed equals
an uninterrupted one bitwise (weights, Adam state, the scaler's scale, the dropout masks drawn from the
device's RNG). The CPU cases run everywhere (compiled with the ``eager`` backend); the CUDA cases are
the GPU tier's (``make test-gpu``; compiled with inductor)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trials_pytorch import ResumeTrial, assert_same_state, config, fit, state_snapshot

from determined_trials.pytorch import Batch

AMP = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
FIT: dict[str, Any] = {"max_length": Batch(10), "validation_period": Batch(5)}
CONF = config({"global_batch_size": 4, "lr": 0.01, "hidden": 8})
STOP_AFTER = 3  # mid-epoch (6 batches per epoch)


def _backend(device: str, compiled: bool) -> str | None:
    if not compiled:
        return None
    return "inductor" if device == "cuda" else "eager"  # inductor's CPU code generation is the slow tier's


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("amp", list(AMP))
def test_resume_is_bitwise_on_the_device(
    tmp_path: Path, device: str, amp: str, compiled: bool, request: pytest.FixtureRequest,
) -> None:
    if compiled:
        request.getfixturevalue("fresh_dynamo")
    def trial(stop_after: int | None = None) -> Any:
        return lambda ctx: ResumeTrial(ctx, stop_after=stop_after, amp_dtype=AMP[amp],
                                       compile_backend=_backend(device, compiled))

    ref, _, _ = fit(trial(), CONF, tmp_path / "ref", **FIT)
    assert ref.context.device.type == device
    first, trainer, info = fit(trial(STOP_AFTER), CONF, tmp_path / "run", **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "stopped"
    uuid = info["checkpoints"][-1].uuid
    second, trainer, _ = fit(trial(), CONF, tmp_path / "run", latest_checkpoint=uuid, **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    assert first.seen + second.seen == ref.seen
    for i, (a, b) in enumerate(zip(first.inputs + second.inputs, ref.inputs)):
        assert torch.equal(a, b), f"batch {i}: different inputs"
    assert_same_state(state_snapshot(second), state_snapshot(ref))
    assert [s.state_dict() for s in second.context.scalers] == [s.state_dict() for s in ref.context.scalers]
    if amp == "fp16":
        assert len(ref.context.scalers) == 1  # use_amp's own GradScaler, checkpointed and restored
