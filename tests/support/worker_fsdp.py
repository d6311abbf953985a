"""One rank of tests/pytorch/test_fsdp.py: runs the scenarios of a JSON plan in order, each a ``det.pytorch.init()``
+ ``Trainer.fit`` of FSDPTrial, and writes ``<out>/<name>-rank<R>.json``.

Usage: worker_fsdp.py PLAN_JSON. A scenario: {"name", "run_dir", "config" (kwargs of config()), "length",
"stop_after" (rank 0 only), "latest_checkpoint" ("newest": the run folder's newest, whichever trial's), "storage"
(a checkpoint_storage mapping), "mesh": true (MeshTrial, tests/pytorch/test_mesh.py)}. The rank layout comes from torchrun's variables.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from trials_fsdp import FSDPTrial, config, fit_kwargs, full_state
from trials_mesh import MeshTrial, mesh_errors

from determined_trials import core, pytorch
from determined_trials.pytorch.parallel._fsdp import is_fsdp

_fail_rank_state: list[int] = []  # [step]: at that checkpoint this rank cannot write its rank_state file
_background: list[int] = []  # steps of the checkpoints this rank started writing in the background


def _count_background_saves() -> None:
    from determined_trials.pytorch.checkpoint import _dcp

    start = _dcp.start_sharded_save

    def counted(path: Any, trial: Any, context: Any, hooks: Any, group: Any, agree: Any) -> Any:
        batch_idx = context._clock.batch_idx
        _background.append(batch_idx + 1 if batch_idx is not None else -1)
        if _fail_rank_state and batch_idx is not None and batch_idx + 1 == _fail_rank_state[0]:
            (path / "rank_state").write_text("a file where the folder goes")  # this rank cannot prepare
        return start(path, trial, context, hooks, group, agree)

    _dcp.start_sharded_save = counted  # type: ignore[assignment]


def run(scenario: dict[str, Any], rank: int) -> dict[str, Any]:
    _background.clear()
    length = scenario.get("length", 12)
    conf = config(length=length, **scenario.get("config", {}))
    if scenario.get("storage"):
        conf["checkpoint_storage"] = scenario["storage"]
    latest = scenario.get("latest_checkpoint")
    if latest == "newest":  # another trial's checkpoint (a PBT child's start)
        latest = core.LocalStore(scenario["run_dir"]).checkpoints()[-1].uuid
    with pytorch.init(exp_conf=conf, run_dir=scenario["run_dir"]) as context:
        trial_class = MeshTrial if scenario.get("mesh") else FSDPTrial
        trial = trial_class(context, stop_after=scenario.get("stop_after") if rank == 0 else None)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(latest_checkpoint=latest, **fit_kwargs(length))
        assert trainer.exit_reason is not None
        return {
            "rank": rank, "size": context.distributed.get_size(), "trial_id": context.get_trial_id(),
            "exit_reason": trainer.exit_reason.value, "fsdp": is_fsdp(trial.model),
            "seen": trial.seen, "state": full_state(trial), "loaded": trial.loaded, "norms": trial.norms,
            "background": list(_background), "syncs": trial.syncs,
        }


def prepare_fails(scenario: dict[str, Any], rank: int) -> dict[str, Any]:
    """Rank 1 cannot prepare its shard of the checkpoint at batch 4: every rank raises, nothing is stored."""
    _fail_rank_state[:] = [4] if rank == 1 else []
    try:
        with pytorch.init(exp_conf=config(), run_dir=scenario["run_dir"]) as context:
            try:
                pytorch.Trainer(FSDPTrial(context), context).fit(**fit_kwargs())
            except RuntimeError as err:
                return {"error": str(err), "trial_id": context.get_trial_id()}
            return {"error": None, "trial_id": context.get_trial_id()}
    finally:
        _fail_rank_state.clear()


def errors() -> dict[str, Any]:
    """The mistakes wrap_model refuses, each with its message (under 2 ranks)."""
    import torch
    from torch import nn
    from trials_fsdp import build_model

    from determined_trials.pytorch.parallel._ddp import wrap_ddp

    found: dict[str, Any] = {}
    with pytorch.init(exp_conf=config(), run_dir=os.environ["DET_RUN_DIR"]) as context:
        cases = {
            "ddp_refuses": lambda: wrap_ddp(build_model(True), torch.device("cpu")),  # torch's own refusal
            "ddp_around": lambda: context.wrap_model(_ddp_around(build_model(True))),
            "no_root": lambda: context.wrap_model(_blocks_only()),
            "mix": lambda: (context.wrap_model(build_model(True)), context.wrap_model(nn.Linear(2, 2))),
        }
        for name, case in cases.items():
            try:
                case()
                found[name] = None
            except Exception as err:  # noqa: BLE001 - the test reads which error and its message
                found[name] = f"{type(err).__name__}: {err}"
    found["uneven"] = None  # 8 validation records in batches of 8: rank 0 would evaluate one batch, rank 1 none
    with pytorch.init(exp_conf=config(val_records=8, val_batch=8), run_dir=os.environ["DET_RUN_DIR"]) as context:
        try:
            pytorch.Trainer(FSDPTrial(context), context).fit(max_length=pytorch.Batch(1), validation_period=pytorch.Batch(1),
                                                             show_progress=False)
        except ValueError as err:
            found["uneven"] = str(err)
    return found


def _ddp_around(model: Any) -> Any:
    """A DistributedDataParallel holding ``model`` (built without DDP's constructor, which refuses
    DTensor parameters itself), as wrap_model would see one."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel.__new__(DistributedDataParallel)
    nn.Module.__init__(ddp)
    ddp.module = model
    return ddp


def _blocks_only() -> Any:
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    fully_shard(model[0])
    return model


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    rank = int(os.environ["RANK"])
    _count_background_saves()
    for scenario in plan["scenarios"]:
        if scenario.get("errors"):
            result = errors()
        elif scenario.get("mesh_errors"):
            result = mesh_errors(rank)
        elif scenario.get("prepare_fails"):
            result = prepare_fails(scenario, rank)
        else:
            result = run(scenario, rank)
        Path(plan["out"], f"{scenario['name']}-rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
