"""What runs on a Ray node for one trial: ``TrialActor`` unpacks the experiment's model folder, starts
the trial process there and forwards its output to the runner over the store channel. No ray import:
the executor wraps the class with ``ray.remote``."""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from determined_trials.core.channel._client import STORE_CHANNEL_ENV, RemoteStore
from determined_trials.core.channel._server import ChannelToken
from determined_trials.experiment._launch import TrialLaunch, trial_command, trial_environment
from determined_trials.experiment._process import TrialProcess

__all__ = ["NODE_ID_ENV", "TrialActor", "pack_folder", "probe_marker"]

NODE_ID_ENV = "DET_RAY_NODE_ID"
_FLUSH_S = 0.2
_POLL_S = 0.1


def pack_folder(folder: Path) -> bytes:
    """``folder``'s files as a gzipped tar (what a node unpacks as the trial's working folder)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buffer.getvalue()


def probe_marker(path: str, expected: str) -> bool:
    """Whether this node sees the marker file ``path`` with the runner's ``expected`` content."""
    try:
        return Path(path).read_text() == expected
    except OSError:
        return False


class _LogForwarder:
    """Collects a trial's output lines and sends them to the runner in batches from a thread."""

    def __init__(self, store: RemoteStore, trial_id: int) -> None:
        self._store, self._trial_id = store, trial_id
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def add(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def _flush(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
        if lines:
            self._store.send_log(self._trial_id, lines)

    def _run(self) -> None:
        while not self._done.wait(_FLUSH_S):
            self._flush()

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=60)
        self._flush()
        self._store.close()


class TrialActor:
    """One run of one trial on a Ray node; ``signal`` may be called while ``run`` runs."""

    def __init__(self) -> None:
        self._proc: TrialProcess | None = None
        self._pending: str | None = None
        self._lock = threading.Lock()

    def run(self, launch: TrialLaunch, model_tar: bytes, entrypoint: Any, run_dir: str, config_text: str,
            token_text: str) -> tuple[int, str]:
        """Run the trial process to its end; its exit status and failure reason."""
        import ray  # only ever imported on a Ray worker

        node_id = ray.get_runtime_context().get_node_id()
        work = Path(tempfile.mkdtemp(prefix=f"det-trial-{launch.trial_id}-"))
        forwarder = _LogForwarder(RemoteStore(ChannelToken.loads(token_text), run_dir), launch.trial_id)
        try:
            with tarfile.open(fileobj=io.BytesIO(model_tar), mode="r:gz") as tar:
                if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
                    tar.extractall(work / "model", filter="data")
                else:  # our own archive (pack_folder), from the runner
                    tar.extractall(work / "model")  # noqa: S202
            (work / "config.yaml").write_text(config_text)
            env = trial_environment(launch, run_dir=Path(run_dir), info_path=work / "cluster_info.json",
                                    config_path=work / "config.yaml",
                                    extra={STORE_CHANNEL_ENV: token_text, NODE_ID_ENV: node_id})
            with self._lock:
                self._proc = TrialProcess(trial_command(entrypoint), env=env, cwd=work / "model",
                                          log_path=work / "trial.log", prefix="", echo=forwarder.add)
                if self._pending:
                    self._apply(self._pending)
            code = self._wait(self._proc)
            return code, ("" if code == 0 else self._proc.reason(code))
        finally:
            forwarder.close()
            shutil.rmtree(work, ignore_errors=True)

    @staticmethod
    def _wait(proc: TrialProcess) -> int:
        while (code := proc.poll()) is None:
            time.sleep(_POLL_S)
        return code

    def signal(self, kind: str) -> None:
        """``TERM``: ask the trial to checkpoint and stop; ``KILL``: end it now."""
        with self._lock:
            if self._proc is None:
                self._pending = kind if kind == "KILL" or self._pending is None else self._pending
            else:
                self._apply(kind)

    def _apply(self, kind: str) -> None:
        assert self._proc is not None
        if kind == "KILL":
            self._proc.kill()
        else:
            self._proc.terminate()

    def pid(self) -> int | None:
        """The trial process's id (its process group), once started."""
        with self._lock:
            return None if self._proc is None else self._proc.pid
