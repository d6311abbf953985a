"""What a trainer's ``fit`` says and decides around the loop: which checkpoint to resume from
(``"latest"`` included), the resume and stop lines, and how a Ctrl-C in a plain script ends."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from determined_trials._info import get_cluster_info
from determined_trials.core._resume import latest_bare_checkpoint, resume_bare_trial
from determined_trials.core.store._records import NotFoundError
from determined_trials.errors import TrainingInterrupted

if TYPE_CHECKING:
    from determined_trials.core import Context
    from determined_trials.loop._controller import ExitReason

__all__ = ["interrupt_stops_training", "resolve_resume"]

_LAUNCH_DIR_ENV = "DET_LAUNCH_DIR"
_CTRL_C = ("det-trials: Ctrl-C: stopping after this batch with a checkpoint "
           "(press Ctrl-C again to abort at once, without one)")


def _say(core: Context, line: str) -> None:
    if core.distributed.get_rank() == 0:
        print(f"det-trials: {line}", file=sys.stderr, flush=True)


def resolve_resume(core: Context, latest_checkpoint: str | None) -> str | None:
    """The checkpoint uuid to resume from. Under a launcher ``None``/``"latest"`` mean the launcher's;
    in a plain script ``"latest"`` means the newest checkpoint of an earlier run of the same
    experiment name in the run folder, and resuming continues that run's trial."""
    if get_cluster_info() is not None:
        if latest_checkpoint in (None, "latest"):
            return core.info.latest_checkpoint
        return latest_checkpoint
    if latest_checkpoint == "latest":
        latest_checkpoint = None
        if core.distributed.get_rank() == 0:
            latest_checkpoint = latest_bare_checkpoint(core.store, core.info.trial)
        if core.distributed.get_size() > 1:
            latest_checkpoint = core.distributed.broadcast(latest_checkpoint)
        if latest_checkpoint is None:
            _say(core, f"no checkpoint to resume from in {core.info.run_dir}: trial "
                       f"{core.info.trial.trial_id} starts from scratch")
            return None
    if latest_checkpoint is not None:
        resume_bare_trial(core, latest_checkpoint)
        if core.distributed.get_rank() == 0:
            _say(core, f"resuming trial {core.info.trial.trial_id} from checkpoint {latest_checkpoint}"
                       f"{_after_batch(core, latest_checkpoint)}")
    return latest_checkpoint


def _after_batch(core: Context, storage_id: str) -> str:
    try:
        return f" (after batch {core.store.checkpoint(storage_id).steps_completed})"
    except NotFoundError:
        return ""


@contextlib.contextmanager
def interrupt_stops_training(core: Context) -> Iterator[list[ExitReason]]:
    """Around the loop: a first Ctrl-C stops training after the batch with a checkpoint. Append the
    loop's exit reason to the yielded list; on the way out a preempted run prints how to resume, and
    a plain script stopped by Ctrl-C raises ``TrainingInterrupted`` (exit status 75)."""
    from determined_trials.loop._controller import ExitReason

    exits: list[ExitReason] = []
    with core.preempt.stop_on_interrupt(_CTRL_C) as interrupted:
        yield exits
    if not exits or exits[0] is not ExitReason.PREEMPTED:
        return
    if get_cluster_info() is not None:
        return  # the experiment runner says how to continue
    launched = bool(os.environ.get(_LAUNCH_DIR_ENV))
    if core.distributed.get_rank() == 0:
        latest = core.store.latest_checkpoint(core.info.trial.trial_id)
        how = "--latest-checkpoint latest" if launched else 'Trainer.fit(latest_checkpoint="latest")'
        if latest is not None:
            _say(core, f"stopped after batch {latest.steps_completed}: trial {core.info.trial.trial_id}, "
                       f"checkpoint {latest.uuid} in {core.info.run_dir}; resume with {how} (or that uuid)")
    if interrupted() and not launched:
        raise TrainingInterrupted()
