"""The torch_distributed launcher with real processes (torchrun, gloo, 127.0.0.1): a 2-worker run, a
worker that raises, SIGTERM as a preemption and the resume, a stop signal while the --trial probe runs, and
the one-slot run without torchrun.
Every run asserts that no process of the job is left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.helpers_launch import (
    DATA,
    TRIAL,
    Launch,
    assert_nothing_left,
    launches_fixture,  # noqa: F401 (the launches fixture)
    tiny_config,
    validation_losses,
)

import determined_trials as det
from determined_trials.launch import PREEMPTED_EXIT_CODE

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device")]


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "tiny_trial.py").write_text(TRIAL)
    (code / "tiny_data.py").write_text(DATA)
    return code


def test_two_workers_train_and_match_one_process(
    tmp_path: Path, code_dir: Path, launches: list[Launch]
) -> None:
    config = tiny_config(tmp_path, "two.yaml", slots=2, batches=8)
    two = Launch(["--config", str(config), "--trial", "tiny_trial.py:TinyTrial"], code_dir, tmp_path / "runs2")
    launches.append(two)
    assert two.finish()[0] == 0, two.output
    assert two.batches() == {0: list(range(8)), 1: list(range(8))}
    assert "[rank=0] [validation] batch 8" in two.output
    assert "Setting OMP_NUM_THREADS" not in two.output  # torchrun's banner: its default is set for it
    assert_nothing_left(two, tmp_path)

    # one slot: no torchrun; the same global batch gives the same validation losses
    one_config = tiny_config(tmp_path, "one.yaml", slots=1, batches=8)
    one = Launch(["--config", str(one_config), "tiny_trial:TinyTrial"], code_dir, tmp_path / "runs1")
    launches.append(one)
    assert one.finish()[0] == 0, one.output
    assert one.batches() == {0: list(range(8))}
    assert "torch.distributed.run" not in one.output and "OMP_NUM_THREADS" not in one.output
    assert validation_losses(tmp_path / "runs2") == pytest.approx(validation_losses(tmp_path / "runs1"), rel=1e-5)
    assert_nothing_left(one, tmp_path)


def test_a_failing_worker_stops_the_job_within_seconds(
    tmp_path: Path, code_dir: Path, launches: list[Launch]
) -> None:
    config = tiny_config(tmp_path, "fail.yaml", slots=2, batches=40, sleep=0.1, fail_rank=1, fail_at=3)
    started = time.monotonic()
    launch = Launch(["--config", str(config), "--trial", "tiny_trial.py:TinyTrial"], code_dir, tmp_path / "runs")
    launches.append(launch)
    raised = launch.wait_for(r"^\[rank=1\] rank 1 trained batch 3$")
    returncode, ended = launch.finish()
    assert returncode != 0, launch.output
    # seconds, plus what starting the same processes took in this run (the machine's load, measured here)
    assert ended - raised < 10 + (raised - started), \
        f"the launcher took {ended - raised:.1f} s to stop after the failure ({raised - started:.1f} s to start)"
    summary = launch.output[launch.output.index("torch_distributed: rank 1 failed with exit code"):]
    assert f"rank 1 failed with exit code {returncode}" in summary
    assert "RuntimeError: boom in batch 3" in summary.splitlines()[0]  # one line: the traceback is not repeated
    tracebacks = [line for line in launch.output.splitlines() if "Traceback (most recent call last)" in line]
    assert [t for t in tracebacks if t.startswith("[rank=1]")] != [], launch.output
    assert [t for t in tracebacks if not t.startswith("[rank=")] == [], launch.output  # not torchrun's
    assert launch.output.count("boom in batch 3\n") == 1, launch.output  # rank 1's traceback, once
    assert max(launch.batches()[0]) < 10  # rank 0 did not train on
    assert_nothing_left(launch, tmp_path)


SLOW_IMPORT = '''
import os
import time
from pathlib import Path

Path(__file__).with_name("probe.pid").write_text(str(os.getpid()))  # the launcher's --trial probe imports us
time.sleep(600)  # ... and is still at it when the signal comes (the test ends it, if the launcher does not)
'''


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_the_trial_probe_runs_exits_preempted_and_ends_the_probe(
    tmp_path: Path, code_dir: Path, launches: list[Launch], sig: signal.Signals
) -> None:
    (code_dir / "slow_import.py").write_text(SLOW_IMPORT)
    config = tiny_config(tmp_path, "slow.yaml", slots=2, batches=4)
    launch = Launch(["--config", str(config), "--trial", "slow_import.py:SlowTrial"], code_dir, tmp_path / "runs")
    launches.append(launch)
    marker = code_dir / "probe.pid"
    deadline = time.monotonic() + 120
    while not marker.exists() or not marker.read_text():
        assert launch.proc.poll() is None and time.monotonic() < deadline, launch.output
        time.sleep(0.02)
    probe = psutil.Process(int(marker.read_text()))
    try:
        launch.proc.send_signal(sig)
        returncode, _ = launch.finish()
        assert returncode == PREEMPTED_EXIT_CODE, launch.output
        assert f"received {sig.name} before starting the workers" in launch.output
        _, alive = psutil.wait_procs([probe], timeout=60)
        assert alive == [], "the probe child outlived the launcher"
        assert_nothing_left(launch, tmp_path)
    finally:
        with contextlib.suppress(psutil.Error):
            probe.kill()


def test_sigterm_preempts_every_rank_at_the_same_batch_and_the_run_resumes(
    tmp_path: Path, code_dir: Path, launches: list[Launch]
) -> None:
    config = tiny_config(tmp_path, "long.yaml", slots=2, batches=24, sleep=0.1)
    run_dir = tmp_path / "runs"
    args = ["--config", str(config), "--trial", "tiny_trial.py:TinyTrial"]
    first = Launch(args, code_dir, run_dir)
    launches.append(first)
    first.wait_for(r"^\[rank=0\] rank 0 trained batch 2$")
    first.proc.send_signal(signal.SIGTERM)
    returncode, _ = first.finish()
    assert returncode == 75, first.output
    assert "preempted, resumable" in first.output
    done = first.batches()
    assert max(done[0]) == max(done[1]) < 23  # both ranks stopped after the same batch, early
    stopped_after = max(done[0]) + 1
    checkpoints = det.core.LocalStore(run_dir).checkpoints()
    assert checkpoints[-1].steps_completed == stopped_after
    assert [t.state for t in det.core.LocalStore(run_dir).trials()] == ["PAUSED"]
    assert_nothing_left(first, tmp_path)

    quick = tiny_config(tmp_path, "quick.yaml", slots=2, batches=24)  # the same run, without the pauses
    second = Launch(["--config", str(quick), "--latest-checkpoint", "latest", "--trial", "tiny_trial.py:TinyTrial"],
                    code_dir, run_dir)
    launches.append(second)
    assert second.finish()[0] == 0, second.output
    resumed = second.batches()
    assert resumed == {0: list(range(stopped_after, 24)), 1: list(range(stopped_after, 24))}
    assert det.core.LocalStore(run_dir).checkpoints()[-1].steps_completed == 24
    assert_nothing_left(second, tmp_path)


def test_the_harness_alone_exits_75_after_a_preemption(tmp_path: Path, code_dir: Path) -> None:
    config = tiny_config(tmp_path, "alone.yaml", slots=1, batches=40, sleep=0.1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env["DET_RUN_DIR"] = str(tmp_path / "runs")
    proc = subprocess.Popen(
        [sys.executable, "-m", "determined_trials.launch.harness", "--config", str(config), "tiny_trial:TinyTrial"],
        cwd=code_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "trained batch 1" in line:
                proc.send_signal(signal.SIGTERM)
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 75, rest
    assert "preempted, resumable" in rest
    (checkpoint,) = [c for c in det.core.LocalStore(tmp_path / "runs").checkpoints() if c.steps_completed < 40]
    assert 2 <= checkpoint.steps_completed <= 6  # the batch after the signal (2 unless the machine is slow)
