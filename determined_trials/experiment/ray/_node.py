"""What runs on a Ray node for one trial: ``TrialActor`` unpacks the experiment's model folder, starts
the trial process there (for a trial over several nodes: that node's launcher, told the node count, its
node rank and the chief's address) and forwards its output to the runner over the store channel. No
ray import at module level: the executor wraps the class with ``ray.remote``."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shutil
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from determined_trials.core.channel import STORE_CHANNEL_ENV, ChannelToken, RemoteStore
from determined_trials.experiment import TrialLaunch, TrialProcess, trial_command, trial_environment
from determined_trials.experiment.ray._files import pack_tensorboard
from determined_trials.launch import TF_WORKERS_ENV, free_port

__all__ = ["NODE_ID_ENV", "NodeRole", "TrialActor", "pack_folder", "probe_marker"]

NODE_ID_ENV = "DET_RAY_NODE_ID"
_FLUSH_S = 0.2
_POLL_S = 0.1
_PEERS_WAIT_S = 300.0  # how long a node waits for the other nodes' actors to say their addresses
_KILL_REAP_S = 5.0
_KILLED_EXIT_CODE = 137


@dataclasses.dataclass(frozen=True)
class NodeRole:
    """This node's part of a trial over ``nnodes`` nodes of ``per_node`` slots; ``peers``: every node's
    actor, in node rank order."""

    nnodes: int
    node_rank: int
    job_id: str
    per_node: int = 1
    peers: tuple[Any, ...] = ()


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
        self._status: str | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def add(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def set_status(self, status: str) -> None:
        """Set the trial's status line (what `trial list` shows) with the next batch of lines."""
        with self._lock:
            self._status = status

    def _flush(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
            status, self._status = self._status, None
        if status:
            self._store.set_trial_status(self._trial_id, status)
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


def _node_address(ray: Any) -> str:
    """The address this Ray node registered with (``ray start --node-ip-address``), which its peers use."""
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id and node.get("NodeManagerAddress"):
            return str(node["NodeManagerAddress"])
    return str(ray.util.get_node_ip_address())


def _node_lines(forwarder: _LogForwarder, node_rank: int) -> Any:
    """An echo that marks a node's launcher lines (the ranks' own lines say ``[rank=R]`` already)."""
    def echo(line: str) -> None:
        forwarder.add(line if line.startswith("[rank=") else f"[node={node_rank}] {line}")
    return echo


class TrialActor:
    """One run of one trial on a Ray node; ``signal`` may be called while ``run`` runs."""

    def __init__(self) -> None:
        self._proc: TrialProcess | None = None
        self._pending: str | None = None
        self._lock = threading.Lock()
        self._endpoint: tuple[str, list[int]] | None = None

    def endpoint(self, count: int) -> tuple[str, list[int]]:
        """This node's address and ``count`` free ports (picked once): torch's rendezvous, our
        collectives, then one per TensorFlow worker of this node."""
        import ray

        with self._lock:
            if self._endpoint is None:
                self._endpoint = (_node_address(ray), [free_port() for _ in range(count)])
            return self._endpoint

    def _node_environment(self, role: NodeRole | None) -> dict[str, str]:
        """What a launcher needs to run one node's ranks of a trial over several nodes: the layout, the
        chief's address and ports, and every TensorFlow worker's address (Keras multi-worker)."""
        if role is None or role.nnodes == 1:
            return {}
        import ray

        count = 2 + role.per_node
        others = {rank: peer.endpoint.remote(count) for rank, peer in enumerate(role.peers) if rank != role.node_rank}
        found = dict(zip(others, ray.get(list(others.values()), timeout=_PEERS_WAIT_S)))
        found[role.node_rank] = self.endpoint(count)
        chief_ip, (master_port, core_port, *_) = found[0]
        workers = [f"{ip}:{port}" for rank in range(role.nnodes) for ip, ports in [found[rank]] for port in ports[2:]]
        return {"DET_NNODES": str(role.nnodes), "DET_NODE_RANK": str(role.node_rank), "DET_CHIEF_IP": chief_ip,
                "DET_MASTER_PORT": str(master_port), "DET_CORE_PORT": str(core_port), "DET_JOB_ID": role.job_id,
                TF_WORKERS_ENV: ",".join(workers)}

    def run(self, launch: TrialLaunch, model_tar: bytes, entrypoint: Any, run_dir: str, config_text: str,
            token_text: str, role: NodeRole | None = None) -> tuple[int, str, bytes]:
        """Run the trial process (this node's part, with ``role``) to its end; its exit status, failure
        reason and the TensorBoard files its ranks wrote on this node (``pack_tensorboard``)."""
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
                                    extra={STORE_CHANNEL_ENV: token_text, NODE_ID_ENV: node_id,
                                           **self._node_environment(role)})
            if role is None or role.node_rank == 0:  # placed: no longer waiting for resources
                forwarder.set_status(f"starting on Ray node {_node_address(ray)}")
            echo = forwarder.add if role is None or role.nnodes == 1 else _node_lines(forwarder, role.node_rank)
            with self._lock:
                if self._pending == "KILL" and role is not None and role.nnodes > 1:
                    return _KILLED_EXIT_CODE, "killed before it started: another node's part of the trial ended", b""
                self._proc = TrialProcess(trial_command(entrypoint), env=env, cwd=work / "model",
                                          log_path=work / "trial.log", prefix="", echo=echo)
                if self._pending:
                    self._apply(self._pending)
            code = self._wait(self._proc)
            tensorboard = pack_tensorboard(Path(run_dir), launch.experiment_id, launch.trial_id)
            return code, ("" if code == 0 else self._proc.reason(code)), tensorboard
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

    def kill_now(self) -> None:
        """SIGKILL the trial process and everything below it (its launcher adopts its orphans), and
        wait a little for them: a peer node failed, so the ranks here would wait for it in vain."""
        with self._lock:
            self._pending = "KILL"
            proc = self._proc
        if proc is None:
            return
        try:
            root = psutil.Process(proc.pid)
            victims = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for victim in victims:
            with contextlib.suppress(psutil.Error):
                victim.kill()
        psutil.wait_procs(victims, timeout=_KILL_REAP_S)

    def pid(self) -> int | None:
        """The trial process's id (its process group), once started."""
        with self._lock:
            return None if self._proc is None else self._proc.pid
