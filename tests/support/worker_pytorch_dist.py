"""One rank of tests/pytorch/test_pytorch_distributed.py: runs the scenarios of a JSON plan in order, each a
``det.pytorch.init()`` + ``Trainer.fit`` of DistTrial, and writes ``<out>/<name>-rank<R>.json``.

Usage: worker_pytorch_dist.py PLAN_JSON. The plan: {"out": dir, "scenarios": [{"name", "run_dir",
"aggregation", "stop_after" (honoured on rank 0 only), "hang_at", "hang_rank", "flag",
"latest_checkpoint"}]}. The rank layout comes from torchrun's environment variables.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from trials_pytorch_dist import DistTrial, config, fit_kwargs, weights

from determined_trials import pytorch
from determined_trials.core import LocalStore

_writes: list[tuple[str, int]] = []  # this rank's calls of the store's write methods


def _track_store_writes() -> None:
    """Record every metrics/checkpoint row this process writes (the chief should write them all)."""
    add_metrics, add_checkpoint = LocalStore.add_metrics, LocalStore.add_checkpoint
    add_reports = LocalStore.add_metrics_reports

    def metrics(self: LocalStore, *args: Any, **kwargs: Any) -> Any:
        _writes.append((f"metrics:{kwargs.get('group')}", int(kwargs["steps_completed"])))
        return add_metrics(self, *args, **kwargs)

    def reports(self: LocalStore, *args: Any, **kwargs: Any) -> Any:
        _writes.extend((f"metrics:{r['group']}", int(r["steps_completed"])) for r in kwargs["reports"])
        return add_reports(self, *args, **kwargs)

    def checkpoint(self: LocalStore, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("pending"):  # a checkpoint is recorded pending first, then completed
            _writes.append(("checkpoint", int(kwargs["steps_completed"])))
        return add_checkpoint(self, *args, **kwargs)

    LocalStore.add_metrics = metrics  # type: ignore[method-assign]
    LocalStore.add_metrics_reports = reports  # type: ignore[method-assign]
    LocalStore.add_checkpoint = checkpoint  # type: ignore[method-assign]


def run(scenario: dict[str, Any], rank: int) -> dict[str, Any]:
    _writes.clear()
    hang = scenario.get("hang_at") if rank == scenario.get("hang_rank") else None
    with pytorch.init(exp_conf=config(scenario.get("aggregation", 1)), run_dir=scenario["run_dir"]) as context:
        trial = DistTrial(context, stop_after=scenario.get("stop_after") if rank == 0 else None,
                          hang_at=hang, flag=scenario.get("flag"))
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(latest_checkpoint=scenario.get("latest_checkpoint"), **fit_kwargs())
        assert trainer.exit_reason is not None
        return {
            "rank": rank, "size": context.distributed.get_size(), "trial_id": context.get_trial_id(),
            "exit_reason": trainer.exit_reason.value, "model_type": type(trial.model).__name__,
            "per_slot_batch_size": context.get_per_slot_batch_size(),
            "seen": trial.seen, "grads": trial.grads, "validated": trial.validated,
            "events": trial.events, "weights": weights(trial), "store_writes": list(_writes),
        }


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    rank = int(os.environ["RANK"])
    _track_store_writes()
    for scenario in plan["scenarios"]:
        result = run(scenario, rank)
        Path(plan["out"], f"{scenario['name']}-rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
