"""A small Core API trial for the dashboard's browser tests: reports training loss every step, progress,
validation and a checkpoint every 5 steps, prints a log line per step, pauses on preemption."""

from __future__ import annotations

import json
import time

import determined_trials as det


def main() -> None:
    with det.core.init() as ctx:
        hp = ctx.info.trial.hparams
        step = 0
        if ctx.info.latest_checkpoint:
            with ctx.checkpoint.restore_path(ctx.info.latest_checkpoint) as path:
                step = json.loads((path / "state.json").read_text())["step"]
            print(f"resumed at step {step}", flush=True)
        loss = 1.0
        for op in ctx.searcher.operations():
            while step < op.length:
                step += 1
                loss = float(hp["lr"]) / step + 0.01
                ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": loss})
                op.report_progress(step)
                print(f"step {step} {hp.get('note', '')} loss={loss:.4f}", flush=True)
                time.sleep(float(hp.get("sleep", 0.05)))
                if step % 5 == 0:
                    ctx.train.report_validation_metrics(steps_completed=step, metrics={"validation_loss": loss})
                    with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
                        (path / "state.json").write_text(json.dumps({"step": step}))
                if ctx.preempt.should_preempt():
                    with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
                        (path / "state.json").write_text(json.dumps({"step": step}))
                    print(f"paused at step {step}", flush=True)
                    return
            op.report_completed(loss)


if __name__ == "__main__":
    main()
