"""A PBT experiment end to end with the tiny Core API trial: children start from their parent's round-end
checkpoint (the first checkpoint they load is that one), a child whose hparams were left unchanged ends
exactly where its parent does, the worst are closed, and the lineage shows in the store, in
``trial describe``/``experiment describe`` and in the dashboard's API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.helpers_experiment import create, make_context

from determined_trials.cli.main import main
from determined_trials.core import LocalStore
from determined_trials.ui import _data
from determined_trials.ui._search import search_view

pytestmark = pytest.mark.slow

LENGTH = 2  # per round


def _first_loaded(run_dir: Path, trial_id: int) -> str | None:
    log = (run_dir / "experiments" / "1" / f"trial_{trial_id}.log").read_text()
    loaded = [line.split()[-1] for line in log.splitlines() if line.startswith("loaded checkpoint ")]
    return loaded[0] if loaded else None


def _final(run_dir: Path, trial_id: int) -> str:
    """The trial's last "done at step N w=..." line (w printed with repr: every bit of the float)."""
    log = (run_dir / "experiments" / "1" / f"trial_{trial_id}.log").read_text()
    return [line for line in log.splitlines() if line.startswith("done at step")][-1]


def test_pbt_children_continue_their_parents_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, ctx = make_context(
        tmp_path, {"lr": {"type": "double", "minval": 0.05, "maxval": 0.9}},
        searcher={"name": "pbt", "metric": "loss", "population_size": 4, "num_rounds": 2, "length_per_round": LENGTH,
                  "replace_function": {"truncate_fraction": 0.5},
                  "explore_function": {"resample_probability": 0.0, "perturb_factor": 0.0}},
        checkpoint_storage={"type": "shared_fs", "host_path": str(tmp_path / "ckpts"), "save_trial_latest": 0,
                            "save_trial_best": 0},  # GC keeps nothing: a child's starting checkpoint must survive anyway
    )
    run_dir = tmp_path / "runs"
    assert create(run_dir, config, ctx, "--max-parallel", "2") == 0
    store = LocalStore(run_dir)
    assert store.experiment(1).state == "COMPLETED"
    trials = store.trials(1)
    first, children = trials[:4], trials[4:]
    assert [t.search_round for t in trials] == [1, 1, 1, 1, 2, 2] and all(t.parent_trial_id is None for t in first)
    assert all(t.state == "COMPLETED" for t in trials)
    round_one = {t.id: next(op.metric for op in store.searcher_ops(t.id) if op.length == LENGTH) for t in first}
    ranked = sorted(round_one, key=lambda tid: (round_one[tid], tid))
    assert sorted(c.parent_trial_id for c in children) == sorted(ranked[:2])  # children of the 2 best
    for worst in ranked[2:]:  # the 2 worst closed after round 1
        assert [op.length for op in store.searcher_ops(worst) if op.completed] == [LENGTH]
    for child in children:
        parent = next(t for t in trials if t.id == child.parent_trial_id)
        at_round_end = [c for c in store.checkpoints(trial_id=parent.id, include_deleted=True)
                        if c.steps_completed == LENGTH]
        assert child.parent_checkpoint == at_round_end[0].uuid == _first_loaded(run_dir, child.id)
        assert at_round_end[0].state == "DELETED"  # collected (the policy keeps none) once the child no longer needed it
        assert child.seed == parent.seed and child.hparams == parent.hparams
        assert [op.length for op in store.searcher_ops(child.id) if op.completed] == [2 * LENGTH]
        assert store.metrics(child.id, "training")[0].steps_completed == LENGTH + 1  # continued, not restarted
        assert _final(run_dir, child.id) == _final(run_dir, parent.id)  # unchanged hparams: exactly the parent's run
    capsys.readouterr()

    child = children[0]
    assert main(["--run-dir", str(run_dir), "trial", "describe", str(child.id)]) == 0
    described = capsys.readouterr().out
    assert re.search(r"\n  search round: +2\n", described)
    assert re.search(rf"\n  parent: +trial {child.parent_trial_id}, from its checkpoint {child.parent_checkpoint}\n",
                     described)
    assert main(["--run-dir", str(run_dir), "experiment", "describe", "1", "--wide"]) == 0
    described = capsys.readouterr().out
    best_id = min(store.best_by_trial(1, "loss", True).items(), key=lambda kv: (kv[1], kv[0]))[0]
    assert re.search(rf"\n  best trial: +{best_id} \(loss = [0-9.e-]+\): lr=", described)
    assert "Lineage (PBT" in described and child.parent_checkpoint in described

    api = {t["id"]: t for t in _data.trials(store, 1)["trials"]}
    assert (api[child.id]["parent_trial_id"], api[child.id]["parent_checkpoint"], api[child.id]["search_round"]) == (
        child.parent_trial_id, child.parent_checkpoint, 2)
    view = search_view(store, 1)
    assert [row["trial_id"] for row in view["lineage"]] == [t.id for t in trials]
    assert [p["number"] for p in view["best_so_far"]] == [1, 2, 3, 4, 5, 6]
    bests = [p["best"] for p in view["best_so_far"]]
    assert bests == sorted(bests, reverse=True) and bests[-1] == store.best_by_trial(1, "loss", True)[best_id]
