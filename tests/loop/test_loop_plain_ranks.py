"""The loop on two ranks (two real processes), with plain functions: every save mode, a stop asked for on the
chief alone, and the resume. Both ranks see the same hooks at the same batches and the same checkpoints;
only the chief saves, except in the sharded modes where each rank writes its shard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from plain_adapter import PlainAdapter, SaveMode, run_loop

from determined_trials import core
from determined_trials.loop import Batch, ExitReason
from determined_trials.testing import run_ranks

pytestmark = pytest.mark.slow

SETTINGS: dict[str, Any] = {"max_length": Batch(10), "validation_period": Batch(4), "checkpoint_period": Batch(2)}
HOOKS = ("startup", "training_start", "epoch_start", "epoch_end", "workload_end", "validation_start",
         "validation_end", "upload_end", "shutdown")
SAVES = ("save", "snapshot", "write_snapshot", "start_sharded_save")
STOP_AT = 5


def _stop_on_the_chief(adapter: PlainAdapter, trained: int) -> None:
    assert adapter.core is not None
    adapter.stop = adapter.core.distributed.get_rank() == 0 and trained == STOP_AT


def _runs(dist: core.DistributedContext, run_dir: str) -> dict[str, Any]:
    """On each rank, for each save mode: a run stopped by the chief, then its resume."""
    outcome: dict[str, Any] = {}
    for mode in SaveMode:
        folder = Path(run_dir, mode.value)
        first = run_loop(folder, distributed=dist, mode=mode, after_batch=_stop_on_the_chief, **SETTINGS)
        second = run_loop(folder, distributed=dist, mode=mode, latest_checkpoint=first.checkpoints[-1].uuid,
                          **SETTINGS)
        outcome[mode.value] = {
            "reasons": (first.reason, second.reason),
            "hooks": [[e for e in run.events if e[0] in HOOKS] for run in (first, second)],
            "saves": [e[0] for run in (first, second) for e in run.events if e[0] in SAVES],
            "trained": [b for run in (first, second) for b, _, _ in run.adapter.trained],
            "w": second.adapter.w,
            "checkpoints": [(c.uuid, c.steps_completed) for c in second.checkpoints],  # the trial's, both runs'
            "files": [second.stored[c.uuid].files for c in second.checkpoints],
        }
    return outcome


def test_two_ranks_agree_in_every_save_mode(tmp_path: Path) -> None:
    chief, worker = run_ranks(_runs, 2, args=(str(tmp_path),), timeout=120)
    single = run_loop(tmp_path / "one-rank", **SETTINGS)
    for mode in SaveMode:
        ours, theirs = chief[mode.value], worker[mode.value]
        assert ours["reasons"] == theirs["reasons"] == (ExitReason.STOPPED, ExitReason.COMPLETED), mode
        assert ours["hooks"] == theirs["hooks"], mode  # the same hooks, checkpoint uuids included
        assert [c[1] for c in ours["checkpoints"]] == [2, 4, 5, 6, 8, 10], mode
        assert ours["checkpoints"] == theirs["checkpoints"], mode
        assert ours["trained"] == theirs["trained"] == list(range(10)), mode
        assert ours["w"] == theirs["w"] == single.adapter.w, mode
        sharded = mode in (SaveMode.SHARDED, SaveMode.ASYNC_SHARDED)
        assert bool(theirs["saves"]) == sharded, mode  # only the chief saves, unless each rank saves its shard
        assert len(ours["saves"]) >= 6, mode
        shards = ["shard-0.json", "shard-1.json"] if sharded else []
        assert all([f for f in files if f.startswith("shard-")] == shards for files in ours["files"]), mode
