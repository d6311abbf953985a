"""One process of ``test_deepspeed_resume_device.py`` (DeepSpeed picks its accelerator once a process, so
each device gets a fresh one): ZeRO-2 in bfloat16 with dropout, a run stopped mid-epoch and resumed from
its checkpoint against an uninterrupted one, and the checkpoint's consolidated export against the
engine's weights at the stop. Writes the comparison as JSON to OUT.

Usage: worker_deepspeed_resume.py DEVICE RUN_DIR OUT  (DEVICE: cpu, gloo; cuda, nccl)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from trials_deepspeed import DSTrial, config

from determined_trials import deepspeed as det_ds
from determined_trials.cli.main import main as cli_main
from determined_trials.core import LocalStore

FIT: dict[str, Any] = {"max_length": det_ds.Batch(20), "reporting_period": det_ds.Batch(5),
                       "checkpoint_period": det_ds.Batch(10), "checkpoint_policy": "none", "show_progress": False}
STOP_AFTER = 12  # mid-epoch (16 batches of 4 records an epoch)


class _BF16Trial(DSTrial):
    """DSTrial with its batches in bfloat16, the engine's dtype."""

    def train_batch(self, dataloader_iter: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = (t.to(torch.bfloat16) for t in self.context.to_device(next(dataloader_iter)))
        loss = nn.functional.mse_loss(self.engine(x), y)
        self.engine.backward(loss)
        self.engine.step()
        if self.stop_after == batch_idx:
            self.context.set_stop_requested(True)
        return {"loss": loss}

    def evaluate_batch(self, dataloader_iter: Any, batch_idx: int) -> dict[str, Any]:
        x, y = (t.to(torch.bfloat16) for t in self.context.to_device(next(dataloader_iter)))
        return {"val_loss": nn.functional.mse_loss(self.engine(x), y)}


def _module_weights(trial: DSTrial) -> list[torch.Tensor]:
    return [p.detach().cpu().clone() for p in trial.engine.module.parameters()]


def _fit(run_dir: Path, stop_after: int | None = None, resume: str | None = None) -> tuple[DSTrial, str]:
    conf = config(stage=2, bf16=True, dropout=0.2, length=20)
    with det_ds.init(exp_conf=conf, run_dir=run_dir) as context:
        trial = _BF16Trial(context, stop_after=stop_after)
        trainer = det_ds.Trainer(trial, context)
        trainer.fit(latest_checkpoint=resume, **FIT)
        assert trainer.exit_reason is not None
        return trial, trainer.exit_reason.value


def main() -> None:
    device, run_dir, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    torch.use_deterministic_algorithms(True)
    straight, _ = _fit(run_dir / "straight")
    stopped, stop_reason = _fit(run_dir / "resumed", stop_after=STOP_AFTER)
    at_stop = _module_weights(stopped)
    (checkpoint,) = [c for c in LocalStore(run_dir / "resumed").checkpoints() if c.steps_completed == STOP_AFTER + 1]
    export = run_dir / "export"
    assert cli_main(["--run-dir", str(run_dir / "resumed"), "checkpoint", "export", checkpoint.uuid, str(export),
                     "--consolidate"]) == 0
    exported = torch.load(export / "model0_consolidated.pt", weights_only=True)
    resumed, end_reason = _fit(run_dir / "resumed", resume=checkpoint.uuid)
    result = {
        "requested": device,
        "device": str(stopped.engine.device),
        "dtype": str(next(stopped.engine.module.parameters()).dtype),
        "stop_reason": stop_reason,
        "end_reason": end_reason,
        "resumed_equals_straight": all(torch.equal(a, b) for a, b in
                                       zip(_module_weights(resumed), _module_weights(straight))),
        "export_equals_engine": all(torch.equal(value.to(weight.dtype), weight)
                                    for value, weight in zip(exported.values(), at_stop)),
        "export_keys": len(exported),
        "parameters": len(at_stop),
    }
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
