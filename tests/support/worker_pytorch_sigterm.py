"""Trains trials_pytorch.ResumeTrial until SIGTERM (used by test_pytorch_trainer_resume).

Usage: worker_pytorch_sigterm.py RUN_DIR FLAG_FILE OUT_JSON. On batch 3 the trial writes FLAG_FILE
and sleeps, so the test's SIGTERM lands inside that batch. OUT_JSON gets the exit reason, the last
checkpoint (uuid, steps_completed), the (epoch_idx, batch_idx, indices) seen and a weights file.
"""

import json
import sys
from pathlib import Path

import torch
from trials_pytorch import ResumeTrial, config

from determined_trials import pytorch


def main() -> None:
    run_dir, flag, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    conf = config({"global_batch_size": 4, "lr": 0.01, "workers": 0, "hidden": 8})
    with pytorch.init(exp_conf=conf, run_dir=run_dir) as context:
        trial = ResumeTrial(context, flag_path=flag, flag_batch=3, batch_sleep=1.0)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(max_length=pytorch.Batch(15), validation_period=pytorch.Batch(5),
                    reporting_period=pytorch.Batch(4), show_progress=False)
        assert context._core is not None and trainer.exit_reason is not None
        last = context._core.store.checkpoints(trial_id=context.get_trial_id())[-1]
        weights = out.with_suffix(".pt")
        torch.save(trial.model.state_dict(), weights)
        out.write_text(json.dumps({
            "exit_reason": trainer.exit_reason.value, "uuid": last.uuid, "steps_completed": last.steps_completed,
            "seen": trial.seen, "weights": str(weights),
        }))


if __name__ == "__main__":
    main()
