"""Train the iris TFKerasTrial with the Trainer API: ``python train.py [--run-dir DIR] [--resume latest]``.

Stop it with Ctrl-C or SIGTERM and run it again with ``--resume latest`` to continue exactly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from model_def import IrisTrial

import determined_trials as det
from determined_trials import keras as det_keras

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(HERE / "const.yaml"))
    parser.add_argument("--run-dir", default=None, help="run folder (default: $DET_RUN_DIR or ./det-runs)")
    parser.add_argument("--resume", default=None, help="checkpoint uuid to resume from, or 'latest'")
    args = parser.parse_args()

    config = det.config.load_config(args.config)
    with det_keras.init(exp_conf=config, run_dir=args.run_dir) as context:
        latest = args.resume
        if latest == "latest":
            checkpoints = context._core.store.checkpoints() if context._core else []
            latest = checkpoints[-1].uuid if checkpoints else None
        trainer = det_keras.Trainer(IrisTrial(context), context)
        trainer.fit(max_length=det_keras.Epoch(config.searcher.max_length.value),
                    validation_period=det_keras.Epoch(5), latest_checkpoint=latest, show_progress=False)
        print(f"finished: {trainer.exit_reason.value if trainer.exit_reason else '?'}")


if __name__ == "__main__":
    main()
