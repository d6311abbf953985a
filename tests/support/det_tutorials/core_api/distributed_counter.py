"""A Core API script shaped like Determined's Core API tutorial 4 (distributed): every rank counts,
the ranks meet in allgathers, the chief reports and checkpoints. Only the import differs."""

import json
import logging
import pathlib

import determined_trials as det
from determined_trials import core


def save_state(x, steps_completed, trial_id, checkpoint_directory):
    with checkpoint_directory.joinpath("state").open("w") as f:
        f.write(f"{x},{steps_completed},{trial_id}")


def load_state(trial_id, checkpoint_directory):
    checkpoint_directory = pathlib.Path(checkpoint_directory)
    with checkpoint_directory.joinpath("state").open("r") as f:
        x, steps_completed, ckpt_trial_id = [int(field) for field in f.read().split(",")]
    if ckpt_trial_id == trial_id:
        return x, steps_completed
    return x, 0


def main(core_context, latest_checkpoint, trial_id, increment_by):
    x = 0
    starting_batch = 0
    if latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            x, starting_batch = load_state(trial_id, path)
    batch = starting_batch
    last_checkpoint_batch = None
    for op in core_context.searcher.operations():
        while batch < op.length:
            # every rank adds its own increment; the allgather makes all ranks agree on the sum
            all_increments = core_context.distributed.allgather(increment_by * (core_context.distributed.rank + 1))
            x += sum(all_increments)
            steps_completed = batch + 1
            if steps_completed % 5 == 0:
                if core_context.distributed.rank == 0:
                    core_context.train.report_training_metrics(steps_completed=steps_completed, metrics={"x": x})
                    op.report_progress(steps_completed)
                    with core_context.checkpoint.store_path({"steps_completed": steps_completed}) as (path, uuid):
                        save_state(x, steps_completed, trial_id, path)
                    last_checkpoint_batch = steps_completed
                if core_context.preempt.should_preempt():
                    return
            batch += 1
        if core_context.distributed.rank == 0:
            core_context.train.report_validation_metrics(steps_completed=steps_completed, metrics={"x": x})
            op.report_completed(x)
    if last_checkpoint_batch != steps_completed and core_context.distributed.rank == 0:
        with core_context.checkpoint.store_path({"steps_completed": steps_completed}) as (path, uuid):
            save_state(x, steps_completed, trial_id, path)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "this example only runs on-cluster"
    latest_checkpoint = info.latest_checkpoint
    trial_id = info.trial.trial_id
    hparams = info.trial.hparams
    slots = {"slot_ids": info.slot_ids, "container_slot_counts": info.container_slot_counts,
             "gpu_uuids": info.gpu_uuids, "container_addrs": info.container_addrs}
    print("cluster " + json.dumps(slots), flush=True)
    distributed = core.DistributedContext.from_torch_distributed()
    with core.init(distributed=distributed) as core_context:
        main(core_context=core_context, latest_checkpoint=latest_checkpoint, trial_id=trial_id,
             increment_by=hparams["increment_by"])
