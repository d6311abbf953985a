"""A real two-node Ray cluster on 127.0.0.1 for the Ray executor tests: a head (2 CPUs, or
``head_cpus``) and a second node (1 CPU), ports picked at run time, a fresh temp folder; stopped by process group, nothing left behind.
The second node may see a private tmpfs over one folder (a mount namespace), to stand for a machine
that does not share that folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support.helpers_experiment import DET_TRIALS

__all__ = ["LocalRayCluster", "can_hide_folders", "driving", "start_ray_runner"]

_RAY = str(Path(sys.executable).with_name("ray"))
_START_TIMEOUT_S = 180.0
_START_TRIES = 3
_MARKER_ENV = "DET_TEST_RAY_CLUSTER"  # set on the cluster's nodes: their workers and trials inherit it


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def can_hide_folders() -> bool:
    """Whether this machine lets us start a process with a private mount (``unshare -m``)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def _node_args(ports: list[int], cpus: int) -> list[str]:
    names = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port")
    args = [f"{name}={port}" for name, port in zip(names, ports)]
    workers = ",".join(str(p) for p in ports[len(names):])
    return [*args, f"--worker-port-list={workers}", f"--num-cpus={cpus}", "--num-gpus=0",
            "--object-store-memory=80000000", "--node-ip-address=127.0.0.1", "--disable-usage-stats", "--block"]


class LocalRayCluster:
    """``start()`` a head and a second node; ``address`` for ``ray.init``/``--ray``; ``stop()``."""

    def __init__(self, hidden_on_second_node: Path | None = None, head_cpus: int = 2) -> None:
        self.head_cpus = head_cpus
        self.temp = Path(tempfile.mkdtemp(prefix="detray-", dir="/tmp"))  # short: Ray's socket paths
        self.hidden = hidden_on_second_node
        self.port = 0  # the head's port and address: picked by start()
        self.address = ""
        self._procs: list[subprocess.Popen[bytes]] = []
        self._killed: list[int] = []  # process groups stopped (a failed start's, then all at stop)
        self._second_ports: list[int] = []
        # Ray's token auth off explicitly: a token file some other Ray left in ~/.ray must not switch it
        # on for the nodes while the test's driver (ray already imported) does not send it.
        self.driver_env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        # Trials give up on a runner that stopped answering after 30 s (default 120 s).
        self._env = {**os.environ, **self.driver_env, "RAY_memory_monitor_refresh_ms": "0",
                     "DET_STORE_CHANNEL_TIMEOUT": "30", _MARKER_ENV: str(self.temp)}

    def _spawn(self, cmd: list[str], log: str) -> None:
        with open(self.temp / log, "wb") as out:
            self._procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                env=self._env, start_new_session=True))

    def start(self) -> LocalRayCluster:
        """Start the head, then the second node. Ports are picked free and then handed to Ray, so another
        process may take one in between: a head that exits before it is up is started again on new ports
        (3 tries), and an error quotes the end of the node's log (the temp folder is removed at stop)."""
        for attempt in range(1, _START_TRIES + 1):
            if self._start_head():
                break
            tail = _log_tail(self.temp / "head.log")
            self._kill_all()
            if attempt == _START_TRIES:
                raise RuntimeError(f"the Ray head did not start in {_START_TRIES} tries; the end of its log:\n{tail}")
            warnings.warn(f"the Ray head exited while starting (try {attempt}; a port taken?): {tail[-300:]}",
                          stacklevel=2)
        second = [_RAY, "start", f"--address={self.address}", *_node_args(self._second_ports, 1)]
        if self.hidden is not None:
            self.hidden.mkdir(parents=True, exist_ok=True)
            script = 'mount -t tmpfs none "$0" && exec "$@"'
            second = ["unshare", "-m", "sh", "-c", script, str(self.hidden), *second]
        self._spawn(second, "second.log")
        self._wait_for_nodes(2)
        return self

    def _start_head(self) -> bool:
        """Spawn the head on newly picked ports (all distinct: picked together); whether it came up."""
        ports = _free_ports(3 + 32)
        self.port, client_port, dashboard_port = ports[:3]  # Ray's dashboard process runs even without the UI
        self.address = f"127.0.0.1:{self.port}"
        self._second_ports = ports[19:]
        head = [_RAY, "start", "--head", f"--port={self.port}", "--include-dashboard=false",
                f"--dashboard-port={dashboard_port}", f"--temp-dir={self.temp}",
                f"--ray-client-server-port={client_port}", *_node_args(ports[3:19], self.head_cpus)]
        self._spawn(head, "head.log")
        deadline = time.monotonic() + _START_TIMEOUT_S
        while "Ray runtime started" not in (self.temp / "head.log").read_text(errors="replace"):
            if self._procs[0].poll() is not None:
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head did not start in {_START_TIMEOUT_S:.0f} s; the end of its log:\n"
                                   f"{_log_tail(self.temp / 'head.log')}")
            time.sleep(0.5)
        return True

    def _wait_for_nodes(self, count: int) -> None:
        import ray

        deadline = time.monotonic() + _START_TIMEOUT_S
        ray.init(address=self.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            while len([n for n in ray.nodes() if n["Alive"]]) < count:
                if time.monotonic() > deadline or any(p.poll() is not None for p in self._procs):
                    raise RuntimeError("the Ray cluster did not start; the end of the second node's log:\n"
                                       f"{_log_tail(self.temp / 'second.log')}")
                time.sleep(0.5)
        finally:
            ray.shutdown()

    def processes(self, fragment: str) -> list[Any]:
        """This cluster's live processes (its workers and what they started, which inherit its marker
        variable) whose command line holds ``fragment``; another test run's cluster on the host is not seen."""
        import psutil

        found = []
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if (fragment in " ".join(proc.info["cmdline"] or [])
                        and proc.environ().get(_MARKER_ENV) == str(self.temp)):
                    found.append(proc)
        return found

    def placement_groups(self) -> list[str]:
        """The states of the cluster's placement groups."""
        import ray

        ray.init(address=self.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            return [group["state"] for group in ray.util.placement_group_table().values()]
        finally:
            ray.shutdown()

    def wait_for_free_cpus(self, cpus: float, timeout: float = 240) -> None:
        """Block until ``cpus`` CPUs are free in the cluster (what ended actors held is given back)."""
        import ray

        ray.init(address=self.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            deadline = time.monotonic() + timeout
            while ray.available_resources().get("CPU", 0) < cpus:
                if time.monotonic() > deadline:
                    raise AssertionError(f"only {ray.available_resources().get('CPU', 0)} CPUs free after {timeout} s")
                time.sleep(0.5)
        finally:
            ray.shutdown()

    def node_ids(self) -> list[str]:
        """The alive nodes' ids, the head's first."""
        import ray

        ray.init(address=self.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            alive = [n for n in ray.nodes() if n["Alive"]]
            alive.sort(key=lambda n: "node:__internal_head__" not in n.get("Resources", {}))
            return [n["NodeID"] for n in alive]
        finally:
            ray.shutdown()

    def kill_second_node(self) -> None:
        """SIGKILL the second node's processes, as when its machine dies."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._procs[1].pid, signal.SIGKILL)
        self._procs[1].wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM every node's process group, SIGKILL what is left after 90 s; remove the temp folder."""
        self._kill_all()
        shutil.rmtree(self.temp, ignore_errors=True)

    def _kill_all(self) -> None:
        for proc in reversed(self._procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self._killed.extend(proc.pid for proc in self._procs)
        self._procs = []

    def leftovers(self) -> list[str]:
        """Processes still running that belong to this cluster (by its temp folder or process groups)."""
        out = subprocess.run(["ps", "-eo", "pid=,pgid=,args="], capture_output=True, text=True, timeout=30).stdout
        groups = {str(pid) for pid in [*self._killed, *(p.pid for p in self._procs)]}
        return [line for line in out.splitlines()
                if line.split(None, 2)[1] in groups or str(self.temp) in line]


@contextlib.contextmanager
def driving(cluster: LocalRayCluster) -> Iterator[LocalRayCluster]:
    """Start ``cluster`` with this process as its driver (its environment set for the block, then put back);
    stop it at the end and check nothing of it is left."""
    saved = {name: os.environ.get(name) for name in cluster.driver_env}
    os.environ.update(cluster.driver_env)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    deadline = time.monotonic() + 30  # SIGKILLed processes may take a moment to leave the process table
    while cluster.leftovers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cluster.leftovers() == []


def start_ray_runner(cluster: LocalRayCluster, run_dir: Path, config: Path, ctx: Path) -> subprocess.Popen[bytes]:
    """`det-trials experiment create --ray` as a process of its own; its output in create.out beside config."""
    cmd = [*DET_TRIALS, "--run-dir", str(run_dir), "experiment", "create", str(config), str(ctx), "--no-progress",
           "--ray", cluster.address]
    with open(config.with_name("create.out"), "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
