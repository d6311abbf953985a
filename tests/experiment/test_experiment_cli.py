"""The det-trials commands on a finished experiment: list, describe, trial logs/metrics, checkpoint
list/export, tensorboard; and the errors of `experiment create`."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.helpers_experiment import create, make_context

from determined_trials.cli._tensorboard import tensorboard_command
from determined_trials.cli.main import main
from determined_trials.core import LocalStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.usefixtures("cpu_device")]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir holding one completed two-trial grid experiment."""
    tmp = tmp_path_factory.mktemp("finished")
    config, ctx = make_context(tmp, {"lr": {"type": "categorical", "vals": [0.2, 0.7]}},
                               searcher={"name": "grid", "metric": "loss", "max_length": 3})
    assert create(tmp / "runs", config, ctx) == 0
    return tmp / "runs"


def run(run_dir: Path, *args: str) -> int:
    return main(["--run-dir", str(run_dir), *args])


def test_list_and_describe(finished: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(finished, "experiment", "list", "--json") == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["name"], listed["state"]) == ("tiny", "COMPLETED")
    assert run(finished, "experiment", "describe", "1") == 0
    out = capsys.readouterr().out
    assert "COMPLETED" in out and "lr=0.7" in out and "grid, metric loss" in out


def test_trial_logs_and_metrics(finished: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(finished, "trial", "logs", "2") == 0
    out = capsys.readouterr().out
    assert out.endswith("done at step 3 w=" + out.rsplit("w=", 1)[1])
    assert run(finished, "trial", "logs", "2", "--tail", "1") == 0
    assert capsys.readouterr().out.startswith("done at step 3")
    assert run(finished, "trial", "metrics", "1", "--group", "validation", "--csv") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "steps_completed,group,loss" and len(lines) == 4
    assert run(finished, "trial", "logs", "99") == 2
    assert "trial 99 not found" in capsys.readouterr().err


def test_checkpoint_list_and_export(finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(finished, "checkpoint", "list", "--experiment", "1", "--json") == 0
    kept = json.loads(capsys.readouterr().out)
    assert kept and all(c["state"] == "COMPLETED" for c in kept)
    uuid = kept[-1]["uuid"]
    assert run(finished, "checkpoint", "export", uuid, str(tmp_path / "out")) == 0
    exported = json.loads((tmp_path / "out" / "state.json").read_text())
    assert exported == json.loads((finished / "checkpoints" / uuid / "state.json").read_text())
    assert run(finished, "checkpoint", "export", uuid, str(tmp_path / "out")) == 2
    assert "not an empty folder" in capsys.readouterr().err
    deleted = [c for c in LocalStore(finished).checkpoints(include_deleted=True) if c.state == "DELETED"]
    assert run(finished, "checkpoint", "export", deleted[0].uuid, str(tmp_path / "gone")) == 2
    assert "was deleted" in capsys.readouterr().err


def test_create_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, ctx = make_context(tmp_path, {})
    (ctx / "data.bin").write_bytes(b"0" * 4096)
    assert run(tmp_path / "runs", "experiment", "create", str(config), str(ctx), "--max-context-mb", "0.001") == 2
    err = capsys.readouterr().err
    assert "data.bin" in err and ".detignore" in err
    assert not (tmp_path / "runs" / "store.sqlite").exists() or not LocalStore(tmp_path / "runs").experiments()
    bad = tmp_path / "bad.yaml"
    bad.write_text("searcher: {name: single, metric: loss, max_length: 2}\n")
    assert run(tmp_path / "runs", "experiment", "create", str(bad), str(ctx)) == 2
    assert "no entrypoint" in capsys.readouterr().err


def test_config_warnings_are_one_line_each_and_not_repeated_by_the_trials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    config, ctx = make_context(tmp_path, {}, bind_mounts=[], optimizations={"mixed_precision": "O1"},
                               searcher={"name": "single", "metric": "loss", "max_length": 2})
    assert create(tmp_path / "runs", config, ctx) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert [x for x in lines if "bind_mounts" in x] == [
        "det-trials: warning: experiment config: ignoring key(s) bind_mounts: they have no effect when running "
        "locally (Determined uses them on a cluster)"]
    assert len([x for x in lines if x.startswith("det-trials: warning: experiment config: ignoring "
                                                 "optimizations.mixed_precision: 'O1'")]) == 1, captured.err
    assert "ConfigWarning" not in captured.err + captured.out  # not Python's form, not from the trial process
    assert "ConfigWarning" not in (tmp_path / "runs" / "experiments" / "1" / "trial_1.log").read_text()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serving(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_tensorboard_command_and_start_stop(finished: Path) -> None:
    logdir = finished / "tensorboard" / "experiment_1"
    cmd = tensorboard_command(logdir, port=1234, host="127.0.0.1")
    assert cmd[1:] == ["-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1", "--port", "1234"]
    assert logdir.is_dir()
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "determined_trials.cli.main", "--run-dir", str(finished),
                             "tensorboard", "1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not _serving(port) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert _serving(port), "TensorBoard did not start"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        time.sleep(0.5)
        assert not _serving(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
