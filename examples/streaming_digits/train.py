"""Train the streaming digits trial with the Trainer API: ``python train.py [--run-dir DIR]``.

``--stop-after-batches N`` stops the run after batch N (``context.set_stop_requested``: a checkpoint, then exit);
``--resume latest`` goes on from it, at the record the stream would have read next. ``--records FILE`` appends
one line per batch trained, ``<batch> <epoch> <the records' rows>``: a stopped run's file, then its resumed run's,
equals an uninterrupted run's. The length and periods come from const.yaml.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from model_def import StreamingDigitsTrial

import determined_trials as det
from determined_trials import pytorch

HERE = Path(__file__).resolve().parent


class StoppingTrial(StreamingDigitsTrial):
    """The example's trial, asking to stop once batch ``stop_after`` (counted from 1) is trained."""

    def __init__(self, context: pytorch.PyTorchTrialContext, stop_after: int | None) -> None:
        super().__init__(context)
        self.stop_after = stop_after

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        if batch_idx + 1 == self.stop_after:
            self.context.set_stop_requested(True)
        return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(HERE / "const.yaml"))
    parser.add_argument("--run-dir", default=None, help="run folder (default: $DET_RUN_DIR or ./det-runs)")
    parser.add_argument("--resume", default=None, help="checkpoint uuid to resume from, or 'latest'")
    parser.add_argument("--stop-after-batches", type=int, default=None, metavar="N", help="stop after batch N")
    parser.add_argument("--records", default=None, metavar="FILE", help="append the records of each batch here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args()

    config = det.config.load_config(args.config)
    length, validation, checkpoint = (config.searcher.max_length, config.min_validation_period,
                                      config.min_checkpoint_period)
    assert length and validation and checkpoint, f"{args.config} names a length and both periods, in batches"
    with pytorch.init(exp_conf=config, run_dir=args.run_dir) as context:
        trial = StoppingTrial(context, args.stop_after_batches)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(
            max_length=pytorch.Batch(length.value),
            validation_period=pytorch.Batch(validation.value),
            checkpoint_period=pytorch.Batch(checkpoint.value),
            latest_checkpoint=args.resume,
            show_progress=False if args.no_progress else None,
        )
        if trial.seen:
            epoch, batch, rows = trial.seen[0]
            print(f"trained batches {batch + 1}-{trial.seen[-1][1] + 1}; the first (epoch {epoch}) read the records "
                  f"{' '.join(map(str, rows[:6]))} ...")
        if args.records:
            with open(args.records, "a") as out:
                out.writelines(f"{b + 1} {e} {' '.join(map(str, rows))}\n" for e, b, rows in trial.seen)
        print(f"finished: {trainer.exit_reason and trainer.exit_reason.value}; trial {context.get_trial_id()}")


if __name__ == "__main__":
    main()
