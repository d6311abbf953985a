"""One rank of tests/deepspeed/test_deepspeed_distributed.py: runs the scenarios of a JSON plan in order, each a
``det.deepspeed.init()`` + ``Trainer.fit`` of a trial of tests/support/trials_deepspeed.py, and writes
``<out>/<name>-rank<R>.json``.

Usage: worker_deepspeed.py PLAN_JSON. A scenario: {"name", "trial" (DSTrial|PipeTrial|PretrainedTrial), "config" (kwargs of
trials_deepspeed.config), "stop_after" / "sigterm_after" + "signal_rank" (batch after which rank 0 asks to
stop / that rank gets SIGTERM), "resume" (the name of an earlier scenario whose last checkpoint to resume) or "resume_uuid" (a checkpoint of
an earlier launch, e.g. on another number of ranks), "state" (record the gathered fp32 weights and Adam moments
at the end), "expect_error" (the scenario fails: record its error)}.
The rank layout comes from torchrun's environment variables.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import trials_deepspeed as T

from determined_trials import deepspeed as det_ds

FIT = {"max_length": det_ds.Batch(10), "reporting_period": det_ds.Batch(3), "validation_period": det_ds.Batch(5),
       "checkpoint_period": det_ds.Batch(5), "checkpoint_policy": "none", "show_progress": False}


class _Signalling(T.DSTrial):
    """DSTrial that sends SIGTERM to its own process after batch ``sigterm_after`` (a preemption)."""

    sigterm_after: int | None = None

    def train_batch(self, dataloader_iter: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        metrics = super().train_batch(dataloader_iter, epoch_idx, batch_idx)
        last_call = self.calls % self.context.get_num_micro_batches_per_slot() == 0
        if batch_idx == self.sigterm_after and last_call:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics


def run(scenario: dict[str, Any], rank: int, checkpoints: dict[str, str]) -> dict[str, Any]:
    run_dir = Path(scenario["run_dir"])
    with det_ds.init(exp_conf=T.config(ranks=scenario.get("dp", 2), **scenario["config"]), run_dir=run_dir) as context:
        cls = {"DSTrial": T.DSTrial, "PipeTrial": T.PipeTrial, "PretrainedTrial": T.PretrainedTrial, "Signalling": _Signalling}[scenario["trial"]]
        trial = cls(context, stop_after=scenario.get("stop_after") if rank == 0 else None)
        if rank == scenario.get("signal_rank"):
            trial.sigterm_after = scenario.get("sigterm_after")  # type: ignore[attr-defined]
        trainer = det_ds.Trainer(trial, context)
        latest = scenario.get("resume_uuid") or checkpoints.get(scenario.get("resume", ""))
        trainer.fit(latest_checkpoint=latest, **FIT)
        assert context._core is not None and trainer.exit_reason is not None
        stored = context._core.store.checkpoints(trial_id=context.get_trial_id())
        return {
            "rank": rank, "exit_reason": trainer.exit_reason.value, "weights": T.weights(trial.engine),
            "events": trial.events, "calls": trial.calls, "eval_calls": trial.eval_calls,
            "built_numel": getattr(trial, "built_numel", None), "zero_stage": trial.engine.zero_optimization_stage(), "global_steps": trial.engine.global_steps,
            "checkpoint": stored[-1].uuid if stored else None,
            "loaded_state": getattr(trial, "loaded_state", None), "scheduler": T.scheduler_state(trial.engine),
            "loaded_scheduler": getattr(trial, "loaded_scheduler", None),
            "final_state": T.full_state(trial.engine) if scenario.get("state") else None,
            "checkpoint_steps": stored[-1].steps_completed if stored else None,
            "stage": trial.engine.grid.get_stage_id() if context.use_pipeline_parallel else None,
            "mpu": [context.mpu.data_parallel_rank, context.mpu.data_parallel_world_size,
                    context.mpu.should_report_metrics, context.mpu.should_build_data_loader],
        }


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    rank = int(os.environ["RANK"])
    checkpoints: dict[str, str] = {}
    for scenario in plan["scenarios"]:
        try:
            result = run(scenario, rank, checkpoints)
        except Exception as exc:  # a scenario that must fail (before any collective) records why
            if not scenario.get("expect_error"):
                raise
            result = {"rank": rank, "error": f"{type(exc).__name__}: {exc}", "checkpoint": None}
        checkpoints[scenario["name"]] = result["checkpoint"]
        Path(plan["out"], f"{scenario['name']}-rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
