"""The commands Determined users type: `e`/`t`/`c` aliases, `--version`, `experiment kill` and
`delete`, `trial describe`, `trial logs -f`."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from support.helpers_experiment import DET_TRIALS, create, make_context, start_runner

from determined_trials import __version__
from determined_trials.cli.main import main
from determined_trials.core import LocalStore


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder with one finished experiment of the tiny Core API trial."""
    tmp = tmp_path_factory.mktemp("finished")
    config, ctx = make_context(tmp, {"ckpt_every": 2})
    assert create(tmp / "runs", config, ctx) == 0
    return tmp / "runs"


def test_aliases_and_version(finished: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for group in ("e", "t", "c"):
        assert main(["--run-dir", str(finished), group, "list"]) == 0
    out = capsys.readouterr().out
    assert out.count("ID") >= 2 and "UUID" in out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"det-trials {__version__}"


def test_trial_describe(finished: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--run-dir", str(finished), "t", "describe", "1"]) == 0
    out = capsys.readouterr().out
    latest = LocalStore(finished).latest_checkpoint(1)
    assert latest is not None
    assert "state:" in out and "COMPLETED" in out and "best loss:" in out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert f"latest checkpoint: {latest.uuid} (step 6)" in lines and any(x.startswith("last validation: step 6: loss=") for x in lines)


def test_logs_follow_on_a_finished_trial_prints_the_log_and_returns(
    finished: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--run-dir", str(finished), "trial", "logs", "1", "-f"]) == 0
    assert "done at step 6" in capsys.readouterr().out


def test_delete_removes_records_checkpoints_and_folders(tmp_path: Path) -> None:
    config, ctx = make_context(tmp_path, {"ckpt_every": 2})
    runs = tmp_path / "runs"
    assert create(runs, config, ctx) == 0
    store = LocalStore(runs)
    uuids = [c.uuid for c in store.checkpoints(include_deleted=True)]
    assert uuids and (runs / "experiments" / "1").is_dir()
    assert main(["--run-dir", str(runs), "experiment", "delete", "1", "--yes"]) == 0
    assert store.experiments() == [] and store.trials() == [] and store.checkpoints(include_deleted=True) == []
    assert not (runs / "experiments" / "1").exists()
    assert not any((runs / "checkpoints" / u).exists() for u in uuids)


def _start_runner(tmp_path: Path, steps: int) -> tuple[subprocess.Popen[bytes], Path]:
    config, ctx = make_context(tmp_path, {"sleep": 0.1, "ckpt_every": 2},
                               searcher={"name": "single", "metric": "loss", "max_length": steps})
    runs = tmp_path / "runs"
    proc = start_runner(runs, config, ctx, tmp_path / "create.out")
    return proc, runs


def _reap(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_kill_stops_a_running_experiment_and_cancels_its_trials(tmp_path: Path) -> None:
    proc, runs = _start_runner(tmp_path, steps=1000)
    try:
        assert main(["--run-dir", str(runs), "experiment", "kill", "1"]) == 0
        proc.wait(timeout=60)  # the runner is gone when kill returns
    finally:
        _reap(proc)
    store = LocalStore(runs)
    assert store.experiment(1).state == "CANCELED" and store.trial(1).state == "CANCELED"
    assert store.metrics(1, "training")[-1].steps_completed < 1000


@pytest.mark.slow
def test_a_killed_runner_says_canceled_exits_3_and_leaves_no_launch_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    temp = tmp_path / "tmp"  # the runner's and its trials' temp folder, where the launcher makes its folder
    temp.mkdir()
    config, ctx = make_context(tmp_path, {"sleep": 0.1, "ckpt_every": 2},
                               entrypoint="python3 -m determined_trials.launch.torch_distributed trial.py",
                               searcher={"name": "single", "metric": "loss", "max_length": 1000})
    runs, out = tmp_path / "runs", tmp_path / "create.out"
    proc = start_runner(runs, config, ctx, out, env={**os.environ, "TMPDIR": str(temp)})
    try:
        assert list(temp.glob("det-launch-*")), out.read_text()  # the running trial's launch folder
        # In a process of its own (in ours, its wait for the runner, our child, would reap its exit status),
        # while we reap the runner (a zombie runner would look alive to it).
        kill = subprocess.Popen([*DET_TRIALS, "--run-dir", str(runs), "experiment", "kill", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            code = proc.wait(timeout=120)
            kill_out, kill_err = kill.communicate(timeout=120)
        finally:
            if kill.poll() is None:
                kill.kill()
                kill.wait(timeout=30)
        assert kill.returncode == 0, kill_err
    finally:
        _reap(proc)
    text = out.read_text()
    assert code == 3, text
    assert "Experiment 1: CANCELED" in text and "PAUSED" not in text and "continue" not in text
    assert not list(temp.glob("det-launch-*")), text
    store = LocalStore(runs)
    assert store.experiment(1).state == "CANCELED" and store.trial(1).state == "CANCELED"
    assert main(["--run-dir", str(runs), "experiment", "continue", "1"]) == 2
    assert "experiment 1 is CANCELED, not PAUSED: it was killed; create a new experiment" in capsys.readouterr().err


@pytest.mark.slow
def test_logs_follow_prints_until_the_trial_ends(tmp_path: Path) -> None:
    proc, runs = _start_runner(tmp_path, steps=12)
    try:
        follow = subprocess.run([*DET_TRIALS, "--run-dir", str(runs), "trial", "logs", "1", "-f"],
                                capture_output=True, text=True, timeout=120)
        assert proc.wait(timeout=120) == 0
    finally:
        _reap(proc)
    assert follow.returncode == 0, follow.stderr
    assert "done at step 12" in follow.stdout  # written after `logs -f` started
