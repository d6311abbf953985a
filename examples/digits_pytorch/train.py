"""Train the digits PyTorchTrial with the Trainer API: ``python train.py [--run-dir DIR]``.

The length and periods come from const.yaml (searcher.max_length, min_validation_period).
Stop it with Ctrl-C (or SIGTERM): it finishes the batch, checkpoints and exits with status 75; run it
again with ``--resume latest`` to continue the same trial exactly. A second Ctrl-C aborts at once.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from model_def import DigitsTrial

import determined_trials as det
from determined_trials import pytorch

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(HERE / "const.yaml"))
    parser.add_argument("--run-dir", default=None, help="run folder (default: $DET_RUN_DIR or ./det-runs)")
    parser.add_argument("--resume", default=None, help="checkpoint uuid to resume from, or 'latest'")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args()

    config = det.config.load_config(args.config)
    with pytorch.init(exp_conf=config, run_dir=args.run_dir) as context:
        trainer = pytorch.Trainer(DigitsTrial(context), context)
        trainer.fit(
            max_length=pytorch.Epoch(config.searcher.max_length.value),
            validation_period=pytorch.Epoch(1),
            checkpoint_period=pytorch.Epoch(4),
            checkpoint_policy="best",
            latest_checkpoint=args.resume,
            show_progress=False if args.no_progress else None,
        )
        print(f"finished: {trainer.exit_reason.value}; trial {context.get_trial_id()}")


if __name__ == "__main__":
    main()
