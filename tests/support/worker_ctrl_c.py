"""A plain Trainer.fit script for test_ctrl_c (Ctrl-C stops, "latest" resumes).

Usage: worker_ctrl_c.py RUN_DIR FLAG_DIR RESUME|- [hold]. On batch_idx 3 (first run only) the trial
writes FLAG_DIR/at-batch and waits until the test's SIGINT has been handled (the preemption request
is set); with ``hold`` it then writes FLAG_DIR/first-seen and waits (bounded) for a second SIGINT.
At the end it writes FLAG_DIR/result.json (exit reason, trial id, batches seen).
"""

import json
import sys
import time
from pathlib import Path
from typing import Any

from trials_pytorch import ResumeTrial, config

from determined_trials import pytorch


class _FlagTrial(ResumeTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext, flags: Path, hold: bool) -> None:
        super().__init__(context)
        self.flags, self.hold = flags, hold

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        out = super().train_batch(batch, epoch_idx, batch_idx)
        if batch_idx == 3 and not (self.flags / "at-batch").exists():
            (self.flags / "at-batch").write_text("3")
            core = self.context._core
            assert core is not None
            _wait(lambda: core.preempt.signalled)
            if self.hold:
                (self.flags / "first-seen").write_text("1")
                _wait(lambda: False)
        return out


def _wait(done: Any, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


def main() -> None:
    run_dir, flags, resume = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    hold = sys.argv[4:] == ["hold"]
    conf = config({"global_batch_size": 4, "lr": 0.01, "workers": 0, "hidden": 8})
    with pytorch.init(exp_conf=conf, run_dir=run_dir) as context:
        trial = _FlagTrial(context, flags, hold)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(max_length=pytorch.Batch(12), validation_period=pytorch.Batch(4), reporting_period=pytorch.Batch(2),
                    show_progress=False, latest_checkpoint=None if resume == "-" else resume)
        assert trainer.exit_reason is not None
        (flags / "result.json").write_text(json.dumps({
            "exit_reason": trainer.exit_reason.value, "trial_id": context.get_trial_id(),
            "batches": [b for _, b, _ in trial.seen],
        }))


if __name__ == "__main__":
    main()
