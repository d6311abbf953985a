"""Ctrl-C and resume in a plain ``Trainer.fit`` script (real processes, real SIGINTs, synchronised on
files the trial writes): the first Ctrl-C stops after the batch with a checkpoint, prints how to
resume and exits 75; a second aborts at once; ``latest_checkpoint="latest"`` continues the trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.helpers_group_run import run_in_group
from support.helpers_paths import REPO, SUPPORT

from determined_trials.core import LocalStore

WORKER = SUPPORT / "worker_ctrl_c.py"
EXAMPLE = REPO / "examples" / "digits_pytorch" / "train.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
       "DET_PROGRESS": "0", "CUDA_VISIBLE_DEVICES": ""}  # the workers train on the CPU (built before cpu_device runs)
ENV.pop("DET_CLUSTER_INFO", None)
ENV.pop("DET_LAUNCH_DIR", None)

# Bounds for a loaded machine (load 10 on 2 cores): a worker that imports torch and trains may take minutes
# where an idle machine takes seconds; every wait below is for an event, these only cap it.
START_S = 600  # a worker's start-up until the file or line the test waits for
END_S = 600  # a stopped worker's checkpoint and exit
RUN_S = 900  # the digits example's resumed run to its end (11 more epochs)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_device"), pytest.mark.timeout(2 * START_S + RUN_S)]


def _as_a_terminal_job() -> None:
    """In the child before it runs: SIGINT at its default, as for a job started from a terminal. A test
    run started in the background by a non-interactive shell (``make test &``) passes SIGINT down ignored,
    and an ignored SIGINT is rightly left alone (Python and the harness install no handler for it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(run_dir: Path, flags: Path, resume: str = "-", *extra: str) -> subprocess.Popen[str]:
    flags.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, str(WORKER), str(run_dir), str(flags), resume, *extra], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_as_a_terminal_job)


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + START_S
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"the worker ended before writing {path.name}:\n{proc.communicate()[0]}")
        assert time.monotonic() < deadline, f"the worker never wrote {path.name}"
        time.sleep(0.01)


def _finish(proc: subprocess.Popen[str]) -> str:
    try:
        return proc.communicate(timeout=END_S)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_ctrl_c_stops_with_a_checkpoint_and_latest_continues_the_trial(tmp_path: Path) -> None:
    run_dir, flags = tmp_path / "run", tmp_path / "flags"
    proc = _start(run_dir, flags)
    _wait_for(flags / "at-batch", proc)
    proc.send_signal(signal.SIGINT)
    output = _finish(proc)
    assert proc.returncode == 75, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    store = LocalStore(run_dir)
    [checkpoint] = store.checkpoints()
    assert checkpoint.steps_completed == 4  # batch_idx 3 finished, then the checkpoint
    stop_lines = [line for line in output.splitlines() if checkpoint.uuid in line]
    assert len(stop_lines) == 1 and 'latest_checkpoint="latest"' in stop_lines[0], output
    [trial] = store.trials()
    assert trial.state == "PAUSED"
    assert [m.steps_completed for m in store.metrics(trial.id, group="training")] == [2, 4]

    proc = _start(run_dir, flags, "latest")
    output = _finish(proc)
    assert proc.returncode == 0, output
    assert f"resuming trial {trial.id} from checkpoint {checkpoint.uuid} (after batch 4)" in output
    result = json.loads((flags / "result.json").read_text())
    assert result["exit_reason"] == "completed" and result["trial_id"] == trial.id
    assert result["batches"] == list(range(4, 12))  # batch_idx is global: 4..11
    [again] = store.trials()  # the same trial went on: no second trial, no second experiment
    assert again.id == trial.id and again.state == "COMPLETED" and len(store.experiments()) == 1
    owner = store.experiment_owner(again.experiment_id)  # the resuming run owned it, not the stopped one
    assert owner is not None and owner[0] == proc.pid
    # one metrics history: the first run's reports, then the owed validation at 4 and the rest
    assert [m.steps_completed for m in store.metrics(trial.id, group="training")] == [2, 4, 6, 8, 10, 12]
    assert [m.steps_completed for m in store.metrics(trial.id, group="validation")] == [4, 8, 12]


def test_second_ctrl_c_aborts_at_once(tmp_path: Path) -> None:
    run_dir, flags = tmp_path / "run", tmp_path / "flags"
    proc = _start(run_dir, flags, "-", "hold")
    _wait_for(flags / "at-batch", proc)
    proc.send_signal(signal.SIGINT)
    _wait_for(flags / "first-seen", proc)  # the first SIGINT was handled; the batch now waits
    proc.send_signal(signal.SIGINT)
    output = _finish(proc)
    assert proc.returncode not in (0, 75), output
    assert "KeyboardInterrupt" in output and "press Ctrl-C again to abort" in output
    assert LocalStore(run_dir).checkpoints() == []


def test_latest_with_nothing_to_resume_starts_from_scratch(tmp_path: Path) -> None:
    run_dir, flags = tmp_path / "run", tmp_path / "flags"
    (flags).mkdir()
    (flags / "at-batch").write_text("skip the stop")
    proc = _start(run_dir, flags, "latest")
    output = _finish(proc)
    assert proc.returncode == 0, output
    assert "no checkpoint to resume from" in output and "starts from scratch" in output
    assert json.loads((flags / "result.json").read_text())["batches"][:2] == [0, 1]


def test_the_digits_example_stops_on_ctrl_c_and_resumes_with_resume_latest(tmp_path: Path) -> None:
    """The bundled examples/digits_pytorch/train.py: Ctrl-C after its first validation line, then
    ``--resume latest`` goes on from that checkpoint in the same trial (it used to start again)."""
    run_dir = tmp_path / "run"
    command = [sys.executable, str(EXAMPLE), "--run-dir", str(run_dir), "--no-progress"]
    env = {**ENV, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_as_a_terminal_job)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # synchronise on the output: the first validation summary
            seen.append(line)
            if line.startswith("[validation]"):
                break
        proc.send_signal(signal.SIGINT)
        output = "".join(seen) + _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, output
    checkpoint = LocalStore(run_dir).checkpoints()[-1]  # "best" also saved one at the validation
    assert f"checkpoint {checkpoint.uuid}" in output
    assert 0 < checkpoint.steps_completed < 540
    resumed = run_in_group([*command, "--resume", "latest"], env=env, timeout=RUN_S)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming trial 1 from checkpoint {checkpoint.uuid}" in resumed.stderr
    assert "finished: completed; trial 1" in resumed.stdout
    assert "batch 45 " not in resumed.stdout  # the first epoch's summaries are not trained again
    assert [t.id for t in LocalStore(run_dir).trials()] == [1]
