"""What a trainer's ``fit`` says and decides around the loop: which checkpoint to resume from
(``"latest"`` included), the resume and stop lines, and how a Ctrl-C in a plain script ends."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from determined_trials._info import get_cluster_info
from determined_trials.core import LATEST, LAUNCH_DIR_ENV, continue_bare_run
from determined_trials.errors import TrainingInterrupted

if TYPE_CHECKING:
    from determined_trials.core import Context
    from determined_trials.loop._controller import ExitReason

__all__ = ["interrupt_stops_training", "resolve_resume"]

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
        if latest_checkpoint in (None, LATEST):
            return core.info.latest_checkpoint
        return latest_checkpoint
    if latest_checkpoint is None:
        return core.info.latest_checkpoint  # what init(latest_checkpoint=...) resumed, if anything
    return continue_bare_run(core, latest_checkpoint)


@contextlib.contextmanager
def interrupt_stops_training(core: Context) -> Iterator[list[ExitReason]]:
    """Around the loop: a first Ctrl-C stops training after the batch with a checkpoint. Append the
    loop's exit reason to the yielded list; on the way out a preempted run, or one the trial stopped
    (``set_stop_requested``), prints how to resume, and a plain script stopped by Ctrl-C raises
    ``TrainingInterrupted`` (exit status 75)."""
    from determined_trials.loop._controller import ExitReason

    exits: list[ExitReason] = []
    with core.preempt.stop_on_interrupt(_CTRL_C) as interrupted:
        yield exits
    if not exits or exits[0] not in (ExitReason.PREEMPTED, ExitReason.STOPPED):
        return
    if get_cluster_info() is not None:
        return  # the experiment runner says how to continue
    launched = bool(os.environ.get(LAUNCH_DIR_ENV))
    if core.distributed.get_rank() == 0:
        latest = core.store.latest_checkpoint(core.info.trial.trial_id)
        how = "--latest-checkpoint latest" if launched else 'Trainer.fit(latest_checkpoint="latest")'
        if latest is not None:
            by = " (set_stop_requested)" if exits[0] is ExitReason.STOPPED else ""
            _say(core, f"stopped{by} after batch {latest.steps_completed}: trial {core.info.trial.trial_id}, "
                       f"checkpoint {latest.uuid} in {core.info.run_dir}; resume with {how} (or that uuid)")
    if interrupted() and not launched:
        raise TrainingInterrupted()
