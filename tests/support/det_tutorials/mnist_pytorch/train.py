"""The tutorial's script: pytorch.init() + Trainer.fit, locally (hparams from const.yaml) or under
det-trials (hparams and the checkpoint to resume from in the cluster info)."""

import argparse
import logging
import pathlib

import yaml
from model_def import MNistTrial

import determined_trials as det
from determined_trials import pytorch


def run(max_length, local: bool = False):
    info = det.get_cluster_info()
    if local:
        conf = yaml.safe_load(pathlib.Path("./const.yaml").read_text())
        hparams = conf["hyperparameters"]
        latest_checkpoint = None
    else:
        hparams = info.trial.hparams
        latest_checkpoint = info.latest_checkpoint

    with pytorch.init() as train_context:
        trial = MNistTrial(train_context, hparams=hparams)
        trainer = pytorch.Trainer(trial, train_context)
        trainer.fit(max_length=max_length, latest_checkpoint=latest_checkpoint)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    parser = argparse.ArgumentParser()
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--batches", type=int)
    group.add_argument("--epochs", type=int)
    args = parser.parse_args()
    if args.batches:
        max_length = pytorch.Batch(args.batches)
    elif args.epochs:
        max_length = pytorch.Epoch(args.epochs)
    else:
        max_length = pytorch.Batch(8)
    local_training = det.get_cluster_info() is None
    run(max_length, local=local_training)
