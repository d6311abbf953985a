"""Experiment runner pieces without trial processes: context snapshot, GC policy, trial commands."""

from __future__ import annotations

import collections
import sys
from pathlib import Path
from typing import Any

import pytest

from determined_trials.core import LocalStore
from determined_trials.experiment import (
    ContextTooLargeError,
    Display,
    RetentionPolicy,
    context_files,
    kept_checkpoints,
    parallelism,
    snapshot_context,
    visible_gpus,
)
from determined_trials.experiment._launch import trial_command
from determined_trials.experiment._process import TrialProcess
from determined_trials.experiment._runner import KILLED_REASON


def _write(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_snapshot_honours_detignore_and_leaves_out_bytecode_and_run_dir(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    for rel in ("train.py", "pkg/model.py", "pkg/__pycache__/model.cpython-311.pyc", "stale.pyc",
                "data/big.bin", "data/keep.txt", "notes.log", "runs/store.sqlite", "sub/notes.log"):
        _write(ctx / rel)
    _write(ctx / ".detignore", "# comments are fine\ndata/*\n!data/keep.txt\n*.log\n")
    dest = ctx / "runs" / "experiments" / "1" / "model"  # the run folder lies inside the context
    snapshot_context(ctx, dest, exclude=[ctx / "runs"])
    copied = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert copied == [".detignore", "data/keep.txt", "pkg/model.py", "train.py"]


def test_snapshot_leaves_out_every_run_folder_and_says_which(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    for rel in ("train.py", "runs_fit/store.sqlite", "runs_fit/checkpoints/a/state.pt", "old/det-runs/store.sqlite",
                "old/det-runs/experiments/1/model/train.py", "data/store.txt", "active/store.sqlite"):
        _write(ctx / rel)
    said: list[str] = []
    dest = tmp_path / "dest"
    snapshot_context(ctx, dest, exclude=[ctx / "active"], say=said.append)
    copied = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert copied == ["data/store.txt", "train.py"]
    assert said == ["left out of the context snapshot: old/det-runs/, runs_fit/ (run folders: they hold store.sqlite)"]
    said.clear()
    snapshot_context(ctx / "data", tmp_path / "dest2", say=said.append)
    assert said == []  # nothing left out: nothing said


def test_snapshot_never_copies_into_itself_without_exclude(tmp_path: Path) -> None:
    _write(tmp_path / "a.py")
    dest = tmp_path / "snap"
    snapshot_context(tmp_path, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["a.py"]


def test_snapshot_size_limit_is_a_clear_error_and_copies_nothing(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    _write(ctx / "train.py")
    _write(ctx / "data.bin", "0" * 5000)
    dest = tmp_path / "dest"
    with pytest.raises(ContextTooLargeError, match=r"data\.bin.*\.detignore"):
        snapshot_context(ctx, dest, max_bytes=4000)
    assert not dest.exists()
    _write(ctx / ".detignore", "*.bin\n")
    assert [p.as_posix() for p in context_files(ctx)] == [".detignore", "train.py"]
    snapshot_context(ctx, dest, max_bytes=4000)


def test_snapshot_of_a_missing_folder_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="context directory"):
        snapshot_context(tmp_path / "nope", tmp_path / "dest")


def _trial_with_checkpoints(store: LocalStore, experiment_id: int, values: list[float]) -> tuple[int, list[str]]:
    trial_id = store.create_trial(experiment_id=experiment_id, hparams={}, seed=0)
    uuids = []
    for step, value in enumerate(values, start=1):
        store.add_metrics(trial_id=trial_id, group="validation", steps_completed=step, metrics={"loss": value})
        uuid = f"{trial_id}-{step}"
        store.add_checkpoint(uuid=uuid, trial_id=trial_id, steps_completed=step, metadata={"steps_completed": step},
                             resources={}, storage="test")
        uuids.append(uuid)
    return trial_id, uuids


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ((0, 1, 1), {"a": [1, 4], "b": [2, 4]}),
        ((0, 0, 1), {"a": [4], "b": [4]}),
        ((0, 2, 0), {"a": [1, 3], "b": [2, 3]}),
        ((0, 0, 0), {"a": [], "b": []}),
        ((1, 0, 0), {"a": [], "b": [2]}),
        ((2, 0, 1), {"a": [4], "b": [2, 3, 4]}),
    ],
)
def test_gc_keeps_exactly_what_the_policy_names(
    tmp_path: Path, counts: tuple[int, int, int], expected: dict[str, list[int]]
) -> None:
    store = LocalStore(tmp_path)
    exp = store.create_experiment(name="gc", config={})
    a, a_uuids = _trial_with_checkpoints(store, exp, [0.5, 0.9, 0.7, 0.8])
    b, b_uuids = _trial_with_checkpoints(store, exp, [0.6, 0.1, 0.2, 0.9])
    policy = RetentionPolicy("loss", True, *counts)
    kept = kept_checkpoints(store, exp, [a, b], policy)
    assert kept == {f"{a}-{s}" for s in expected["a"]} | {f"{b}-{s}" for s in expected["b"]}


def test_gc_larger_is_better(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    exp = store.create_experiment(name="gc", config={})
    a, _ = _trial_with_checkpoints(store, exp, [0.5, 0.9, 0.7, 0.8])
    assert kept_checkpoints(store, exp, [a], RetentionPolicy("loss", False, 0, 1, 0)) == {f"{a}-2"}


def test_trial_command_forms() -> None:
    legacy = trial_command("model_def:MyTrial")
    assert legacy[1:] == ["-m", "determined_trials.launch.torch_distributed", "--", "--trial", "model_def:MyTrial"]
    assert legacy[0] == sys.executable
    assert trial_command("python3 train.py --epochs 2") == ["python3", "train.py", "--epochs", "2"]
    assert trial_command("python3 train.py && echo done") == ["sh", "-c", "python3 train.py && echo done"]
    assert trial_command("FOO=1 python3 train.py") == ["sh", "-c", "FOO=1 python3 train.py"]
    assert trial_command(["python3", "-m", "x"]) == ["python3", "-m", "x"]


def test_parallelism_respects_request_searcher_and_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    from determined_trials.config import load_config

    def config(slots: int, concurrent: int, max_slots: int | None = None) -> Any:
        return load_config({"searcher": {"name": "grid", "metric": "loss", "max_length": 1,
                                         "max_concurrent_trials": concurrent},
                            "resources": {"slots_per_trial": slots, "max_slots": max_slots}})

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2,3,5")
    assert visible_gpus() == ["0", "2", "3", "5"]
    assert parallelism(config(1, 16), None) == 1
    assert parallelism(config(1, 16), 8) == 4
    assert parallelism(config(2, 16), 8) == 2
    assert parallelism(config(1, 3), 8) == 3
    assert parallelism(config(8, 16), 8) == 1  # never below one trial at a time
    assert parallelism(config(1, 16, max_slots=2), None) == 2
    assert parallelism(config(1, 16, max_slots=2), 3) == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_display_with_progress_bar_and_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    shown = Display(progress=True)
    shown.echo("[trial 1] hello")
    shown.update(0.5)
    shown.close()
    assert "[trial 1] hello" in capsys.readouterr().out
    quiet = Display(quiet=True)
    quiet.echo("nothing")
    assert capsys.readouterr().out == ""


def test_the_final_trials_table_cuts_hyperparameters_to_fit() -> None:
    from determined_trials.experiment import TrialSummary, trials_table

    rows = [TrialSummary(i, {f"hparam_{k}": k for k in range(20)}, "COMPLETED", 0.5, "c" * 36, 0) for i in (1, 2)]
    whole = trials_table(rows, "loss")
    assert "hparam_19=19" in whole and max(len(x) for x in whole.splitlines()) > 200
    fitted = trials_table(rows, "loss", fit=120)
    assert max(len(x) for x in fitted.splitlines()) <= 120 and "…" in fitted and "c" * 36 in fitted


class _Handle:
    """A trial that runs until it is killed; ``on_poll`` plays what happens outside while it runs."""

    def __init__(self, on_poll: Any) -> None:
        self.terminated = self.killed = False
        self._on_poll = on_poll

    def poll(self) -> int | None:
        self._on_poll(self)
        return -9 if self.killed else None

    def wait(self, timeout: float | None = None) -> int:
        return -9

    def terminate(self) -> None:
        self.terminated = True

    def kill(self) -> None:
        self.killed = True

    def reason(self, code: int) -> str:
        return f"exit {code}"


class _Executor:
    def __init__(self, on_poll: Any) -> None:
        self.handles: list[_Handle] = []
        self._on_poll = on_poll

    def prepare(self, config: Any, storage: Any) -> None:
        """Nothing to check."""

    def start(self, job: Any) -> _Handle:
        self.handles.append(_Handle(self._on_poll))
        return self.handles[-1]

    def close(self) -> None:
        """Nothing held."""


@pytest.mark.parametrize("paused_first", [False, True])
def test_a_runner_whose_experiment_was_killed_ends_canceled_not_paused(tmp_path: Path, paused_first: bool) -> None:
    from determined_trials.config import load_config
    from determined_trials.experiment import ExperimentRunner
    from determined_trials.searcher import make_searcher

    config = load_config({"entrypoint": "python3 x.py", "searcher": {"name": "single", "metric": "loss",
                                                                      "max_length": 5}})
    store = LocalStore(tmp_path / "runs")
    exp = store.create_experiment(name="x", config=config.as_dict())
    polls = {"n": 0}

    def outside(handle: _Handle) -> None:  # what `experiment kill` does: mark CANCELED, then signal the runner
        polls["n"] += 1
        if paused_first and polls["n"] == 1:
            runner.request_stop()  # a Ctrl-C first: the trial is asked to checkpoint and stop...
        elif polls["n"] == (3 if paused_first else 1):
            store.set_experiment_state(exp, "CANCELED", "killed")  # ... and killed while it does
            runner.request_stop()

    executor = _Executor(outside)
    runner = ExperimentRunner(store=store, experiment_id=exp, config=config, searcher=make_searcher(config),
                              exp_dir=tmp_path / "exp", model_dir=tmp_path, config_path=tmp_path / "c.yaml",
                              display=Display(progress=False), executor=executor)
    runner.start_fresh()
    assert runner.run() == "CANCELED"
    (handle,) = executor.handles
    assert handle.killed and handle.terminated == paused_first
    assert store.experiment(exp).state == "CANCELED" and store.experiment(exp).reason == KILLED_REASON
    assert [t.state for t in store.trials(exp)] == ["CANCELED"]


def test_a_failure_reason_says_where_the_output_is_in_words_that_fit_the_dashboard() -> None:
    """The launcher's terminal verdict "(its output is above, prefixed [rank=0])" is left out of the stored
    reason (it names the log instead), and a kill's reason fits the command line and the dashboard alike."""
    proc = TrialProcess.__new__(TrialProcess)  # only what reason() reads
    proc.tail = collections.deque(["[rank=0] Traceback (most recent call last):", "[rank=0] ValueError: bad",
                                   "torch_distributed: rank 0 failed with exit code 1: ValueError: bad "
                                   "(its output is above, prefixed [rank=0])"])
    proc.log_path = Path("/r/trial_1.log")
    assert proc.reason(1) == ("trial process failed (exit code 1): torch_distributed: rank 0 failed with exit code 1: "
                              "ValueError: bad (whole output: /r/trial_1.log)")
    assert "dashboard" in KILLED_REASON and "det-trials experiment kill" in KILLED_REASON


def test_a_trial_process_wakes_the_runner_when_its_output_ends(tmp_path: Path) -> None:
    """A process started cold calls ``on_output_end`` once its output is read to the end (it exited): the runner
    polls it then rather than at its next 50 ms tick."""
    import threading

    ended = threading.Event()
    lines: list[str] = []
    proc = TrialProcess([sys.executable, "-c", "print('bye')"], env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path,
                        log_path=tmp_path / "trial.log", prefix="[t] ", echo=lines.append, on_output_end=ended.set)
    assert ended.wait(120)
    assert proc.wait(timeout=120) == 0
    assert lines == ["[t] bye"]
