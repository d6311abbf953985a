"""A PBT search whose runner is killed (SIGKILL) twice, once while a member waits for the round's end and once
after a round ended but before its child started, then `det-trials experiment continue`: the population and
rounds complete, no trial is made twice, and the child still starts from its parent's round-end checkpoint.
Also: a trial the runner creates is in its saved state before its process starts."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.helpers_experiment import DET_TRIALS, kill_runner, make_context

from determined_trials.cli.main import main
from determined_trials.core import LocalStore
from determined_trials.experiment._report import Display

LENGTH = 3  # per round


def _first_loaded(run_dir: Path, trial_id: int) -> str | None:
    log = (run_dir / "experiments" / "1" / f"trial_{trial_id}.log").read_text()
    loaded = [line.split()[-1] for line in log.splitlines() if line.startswith("loaded checkpoint ")]
    return loaded[0] if loaded else None


def _kill_runner_when(run_dir: Path, args: list[str], out: Path, ready: Callable[[LocalStore], bool]) -> dict[str, Any]:
    """Run `det-trials ARGS` in a session of its own until ``ready(store)``, then kill -9 it (its trials end by
    themselves); returns the runner state it had saved (what `continue` goes on from)."""
    with open(out, "wb") as sink:
        proc = subprocess.Popen([*DET_TRIALS, "--run-dir", str(run_dir), *args, "--no-progress"], stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            if (run_dir / "store.sqlite").exists():
                store = LocalStore(run_dir)
                try:
                    if ready(store):
                        break
                except KeyError:  # the experiment is not recorded yet
                    pass
                finally:
                    store.close()
            time.sleep(0.05)
    finally:
        kill_runner(proc)
    store = LocalStore(run_dir)
    saved = store.experiment(1).searcher_state
    store.close()
    assert saved is not None
    return saved


def _waiting_while_the_next_one_trains(store: LocalStore) -> bool:
    """Trial 1 finished round 1 and waits; trial 2 has a checkpoint but has not reached the round's end."""
    trials = store.trials(1)
    if len(trials) < 2:
        return False
    latest = store.latest_checkpoint(2)
    return trials[0].state == "PAUSED" and latest is not None and latest.steps_completed < LENGTH


def _round_two_before_its_child(store: LocalStore) -> bool:
    """A survivor trains round 2 (a checkpoint past the first round's end); the child is not made yet."""
    trials = store.trials(1)
    past = any(c.steps_completed > LENGTH for t in trials for c in store.checkpoints(trial_id=t.id))
    return len(trials) == 3 and past


@pytest.mark.slow
def test_a_pbt_search_killed_twice_then_continued(tmp_path: Path) -> None:
    config, ctx = make_context(
        tmp_path, {"lr": {"type": "double", "minval": 0.05, "maxval": 0.9}, "sleep": 0.3},
        searcher={"name": "pbt", "metric": "loss", "population_size": 3, "num_rounds": 2, "length_per_round": LENGTH,
                  "replace_function": {"truncate_fraction": 0.34},
                  "explore_function": {"resample_probability": 0.0, "perturb_factor": 0.2}},
        checkpoint_storage={"type": "shared_fs", "host_path": str(tmp_path / "ckpts"), "save_trial_latest": 0,
                            "save_trial_best": 0},  # GC keeps nothing: the child's starting checkpoint must survive
    )
    run_dir = tmp_path / "runs"
    first = _kill_runner_when(run_dir, ["experiment", "create", str(config), str(ctx), "--max-parallel", "1"],
                              tmp_path / "create.out", _waiting_while_the_next_one_trains)
    assert [r for r, _ in first["searcher"]["reports"]] == [0]  # trial 1 reported round 1, the others not yet
    assert [w["trial_id"] for w, _ in first["ended_by_searcher"]] == [1]  # and waits, kept by the runner

    second = _kill_runner_when(run_dir, ["experiment", "continue", "1"], tmp_path / "continue.out",
                               _round_two_before_its_child)
    (queued_child,) = [w for w in second["queue"] if w["parent_trial_id"] is not None]
    assert queued_child["trial_id"] is None and queued_child["warm_start"]  # its start travels in the saved queue
    assert second["searcher"]["round"] == 2

    assert main(["--run-dir", str(run_dir), "experiment", "continue", "1", "--no-progress"]) == 0
    store = LocalStore(run_dir)
    assert store.experiment(1).state == "COMPLETED"
    trials = store.trials(1)
    assert [t.search_round for t in trials] == [1, 1, 1, 2]  # population 3 + one child: none made twice
    assert all(t.state == "COMPLETED" for t in trials)
    round_one = {t.id: [op.metric for op in store.searcher_ops(t.id) if op.completed and op.length == LENGTH]
                 for t in trials[:3]}
    assert all(len(set(metrics)) == 1 for metrics in round_one.values()), round_one  # one round-1 result each
    ranked = sorted(round_one, key=lambda tid: (round_one[tid][0], tid))
    child = trials[3]
    assert child.parent_trial_id == ranked[0]  # the child of the best
    parent = store.trial(ranked[0])
    at_round_end = [c for c in store.checkpoints(trial_id=parent.id, include_deleted=True)
                    if c.steps_completed == LENGTH]
    assert child.parent_checkpoint == queued_child["warm_start"] == at_round_end[-1].uuid
    assert _first_loaded(run_dir, child.id) == child.parent_checkpoint  # started from its parent's checkpoint
    assert child.seed == parent.seed
    assert sorted({m.steps_completed for m in store.metrics(child.id, "training")}) == list(range(LENGTH + 1, 2 * LENGTH + 1))
    worst = ranked[-1]
    assert max(m.steps_completed for m in store.metrics(worst, "training")) == LENGTH  # closed after round 1
    for tid in (*ranked[:2], child.id):  # round 2's population all reached its end
        assert 2 * LENGTH in {op.length for op in store.searcher_ops(tid) if op.completed}
    assert at_round_end[-1].state == "DELETED"  # collected once the child no longer needed it


class _DoneAtOnce:
    """A trial process that has already exited (status 0)."""

    terminated = False

    def poll(self) -> int | None:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def terminate(self) -> None:
        self.terminated = True

    def kill(self) -> None:
        """Already ended."""

    def reason(self, code: int) -> str:
        return f"exit {code}"


def test_a_trial_is_in_the_saved_state_before_its_process_starts(tmp_path: Path) -> None:
    """A runner killed while the executor starts a trial (a slow spawn, a checkpoint storage listing) must not
    leave a trial that `continue` knows nothing of and makes again."""
    from determined_trials.config import load_config
    from determined_trials.experiment import ExperimentRunner
    from determined_trials.searcher import make_searcher

    config = load_config({"entrypoint": "python3 x.py", "hyperparameters": {"a": {"type": "categorical",
                                                                                 "vals": [1, 2]}},
                          "searcher": {"name": "grid", "metric": "loss", "max_length": 5}})
    store = LocalStore(tmp_path / "runs")
    exp = store.create_experiment(name="x", config=config.as_dict())
    saved_at_start: list[list[int | None]] = []

    class Executor:
        def prepare(self, config: Any, storage: Any) -> None:
            """Nothing to check."""

        def start(self, job: Any) -> _DoneAtOnce:
            saved = store.experiment(exp).searcher_state or {"queue": []}
            saved_at_start.append([job.launch.trial_id, *(w["trial_id"] for w in saved["queue"])])
            return _DoneAtOnce()

        def close(self) -> None:
            """Nothing held."""

    runner = ExperimentRunner(store=store, experiment_id=exp, config=config, searcher=make_searcher(config),
                              exp_dir=tmp_path / "exp", model_dir=tmp_path, config_path=tmp_path / "c.yaml",
                              display=Display(progress=False), executor=Executor())
    runner.start_fresh()
    assert runner.run() == "COMPLETED"
    # when trial N's process starts, the saved queue holds trial N first, then what is still to make
    assert saved_at_start == [[1, 1, None], [2, 2]]
    assert [t.id for t in store.trials(exp)] == [1, 2]
