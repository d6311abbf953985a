"""One rank of tests/pytorch/test_tiny_lm_example.py: runs the scenarios of a JSON plan in order, each a
``det.pytorch.init()`` + ``Trainer.fit`` of examples/tiny_lm's TinyLMTrial (shrunk by the plan's hyperparameters),
and writes ``<out>/<name>-rank<R>.json`` (exit reason, reported metrics) and ``<out>/<name>-rank<R>.pt`` (the
unsharded weights, AdamW state and learning rate at the end: a collective under FSDP2).

Usage: worker_tiny_lm.py PLAN_JSON. A scenario: {"name", "run_dir", "config", "length", "stop_after" (a
batch_idx: rank 0 requests a stop after training it), "latest_checkpoint"}. The rank layout comes from
torchrun's variables."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from helpers_paths import REPO

sys.path.insert(0, str(REPO / "examples" / "tiny_lm"))

from model_def import TinyLMTrial  # noqa: E402

from determined_trials import pytorch  # noqa: E402
from determined_trials.pytorch.parallel._fsdp import is_fsdp  # noqa: E402


class Recorder(pytorch.PyTorchCallback):
    """Every training and validation report of the run, as plain floats."""

    def __init__(self) -> None:
        self.training: list[dict[str, float]] = []
        self.validation: list[dict[str, float]] = []

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        self.training.append({k: float(v) for k, v in avg_metrics.items()})

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.validation.append({k: float(v) for k, v in metrics.items()})


class StoppingTrial(TinyLMTrial):
    """The example's trial, which requests a stop after batch ``stop_after``, and records its reports."""

    def __init__(self, context: pytorch.PyTorchTrialContext, stop_after: int | None) -> None:
        super().__init__(context)
        self.stop_after = stop_after
        self.recorder = Recorder()

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"recorder": self.recorder}

    def train_batch(self, batch: torch.Tensor, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        if batch_idx == self.stop_after:
            self.context.set_stop_requested(True)
        return metrics


def full_state(trial: TinyLMTrial) -> dict[str, Any]:
    """Unsharded weights and optimizer state (FQN keys) and the learning rate."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_sd, optim_sd = get_state_dict(trial.model, trial.optimizer, options=StateDictOptions(full_state_dict=True))
    state: dict[str, Any] = {f"model.{k}": v for k, v in model_sd.items()}
    for name, per_param in optim_sd["state"].items():
        for key, value in per_param.items():
            state[f"optim.{name}.{key}"] = value
    state["lr"] = torch.tensor(trial.optimizer.param_groups[0]["lr"], dtype=torch.float64)
    return state


def run(scenario: dict[str, Any], rank: int, out: Path) -> dict[str, Any]:
    length = scenario["length"]
    with pytorch.init(exp_conf=scenario["config"], run_dir=scenario["run_dir"]) as context:
        trial = StoppingTrial(context, scenario.get("stop_after") if rank == 0 else None)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(
            max_length=pytorch.Batch(length), reporting_period=pytorch.Batch(scenario["report"]),
            validation_period=pytorch.Batch(scenario["validate"]), checkpoint_period=pytorch.Batch(scenario["validate"]),
            latest_checkpoint=scenario.get("latest_checkpoint"), show_progress=False,
        )
        assert trainer.exit_reason is not None
        torch.save(full_state(trial), out / f"{scenario['name']}-rank{rank}.pt")
        return {"exit_reason": trainer.exit_reason.value, "fsdp": is_fsdp(trial.model),
                "training": trial.recorder.training, "validation": trial.recorder.validation}


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    rank = int(os.environ["RANK"])
    out = Path(plan["out"])
    for scenario in plan["scenarios"]:
        result = run(scenario, rank, out)
        (out / f"{scenario['name']}-rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
