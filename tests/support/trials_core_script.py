"""A tiny Core API trial for the experiment-runner tests: no torch, deterministic given its seed,
a checkpoint every ``ckpt_every`` steps, and knobs to fail, raise InvalidHP or run slowly."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import determined_trials as det


def _noise(seed: int, step: int) -> float:
    return random.Random(seed * 1_000_003 + step).uniform(-0.01, 0.01)


def _maybe_crash(hp: dict[str, Any], trial_id: int, step: int) -> None:
    if step != hp.get("crash_at"):
        return
    marker = Path(hp["crash_dir"]) / f"crashes_{trial_id}"
    done = int(marker.read_text()) if marker.exists() else 0
    if done < int(hp.get("crash_times", 1)):
        marker.write_text(str(done + 1))
        raise RuntimeError(f"boom at step {step}")


def _save(ctx: Any, state: dict[str, Any]) -> None:
    with ctx.checkpoint.store_path({"steps_completed": state["step"]}) as (path, _):
        (path / "state.json").write_text(json.dumps(state))


def _validate(ctx: Any, hp: dict[str, Any], state: dict[str, Any]) -> float:
    loss = (state["w"] - hp["target"]) ** 2
    curve = hp.get("curve")
    value = float(curve[(state["step"] - 1) % len(curve)]) if curve else loss
    ctx.train.report_validation_metrics(steps_completed=state["step"], metrics={"loss": value})
    ctx.train.set_status("training")  # as the Trainer's loop does after a validation
    return value


def main() -> None:
    with det.core.init() as ctx:
        hp, trial_id, seed = ctx.info.trial.hparams, ctx.info.trial.trial_id, ctx.info.trial.trial_seed
        if hp.get("invalid"):
            raise det.InvalidHP("these hyperparameters are invalid")
        state: dict[str, Any] = {"step": 0, "w": 0.0}
        if ctx.info.latest_checkpoint:
            with ctx.checkpoint.restore_path(ctx.info.latest_checkpoint) as path:
                state = json.loads((path / "state.json").read_text())
            print(f"loaded checkpoint {ctx.info.latest_checkpoint}")
            print(f"resumed at step {state['step']}")
        metric = None
        for op in ctx.searcher.operations():
            while state["step"] < op.length:
                _maybe_crash(hp, trial_id, state["step"] + 1)
                state["step"] += 1
                state["w"] += hp["lr"] * (hp["target"] - state["w"]) + _noise(seed, state["step"])
                ctx.train.report_training_metrics(steps_completed=state["step"], metrics={"w": state["w"]})
                time.sleep(float(hp.get("sleep", 0)))
                if state["step"] % int(hp.get("ckpt_every", 1)) == 0 or state["step"] == op.length:
                    metric = _validate(ctx, hp, state)
                    _save(ctx, state)
                if ctx.preempt.should_preempt():
                    if state["step"] % int(hp.get("ckpt_every", 1)):
                        _save(ctx, state)
                    print(f"preempted at step {state['step']}")
                    return
            op.report_completed(metric if metric is not None else _validate(ctx, hp, state))
        print(f"done at step {state['step']} w={state['w']!r}")
        sys.stdout.flush()
        os.environ.get("DET_CLUSTER_INFO")


if __name__ == "__main__":
    main()
