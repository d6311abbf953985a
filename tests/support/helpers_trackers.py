"""Helpers for the tracker tests: a real ``mlflow server`` on 127.0.0.1 (a free port, stopped by the caller), a
TCP relay in front of it that can be cut and restored (a server that goes away mid-run), a run's metric history
read back with MLflow's client, and the records of W&B's offline ``.wandb`` files (decoded with wandb's own
protobuf ``Record``: wandb 0.31 ships no Python reader of its transaction log)."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["Relay", "free_port", "mlflow_server", "mlflow_steps", "wait_for", "wait_stopped", "wandb_records", "wandb_steps"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def mlflow_server(folder: Path, *, deadline_s: float = 180.0) -> Iterator[str]:
    """A real MLflow tracking server (SQLite backend in ``folder``), its URI while the block runs."""
    port = free_port()
    script = Path(sys.executable).with_name("mlflow")
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [str(script), "server", "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
           "--default-artifact-root", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    with open(folder / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + deadline_s
        while True:
            assert proc.poll() is None, (folder / "server.log").read_text()
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < end, f"mlflow server not up in {deadline_s} s"
            time.sleep(0.2)
        yield uri
    finally:  # a throw-away test server: no graceful shutdown to wait for
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


class Relay:
    """A TCP relay on a free port to ``target`` (host, port); ``cut()`` refuses new connections and drops open
    ones (a server gone away), ``restore()`` relays again. ``close()`` stops it."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").split(":")
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.uri = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._up = threading.Event()
        self._up.set()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        with self._lock:  # under the lock: a connection being set up now is either dropped here or refused
            self._up.clear()
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.close()
            self._open.clear()

    def restore(self) -> None:
        self._up.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                if not self._up.is_set():  # cut while this connection was being set up
                    client.close()
                    upstream.close()
                    continue
                self._open += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (b if sock is a else a).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.close()


def mlflow_steps(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of the run's history of ``key``, in step order."""
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)
    return sorted((int(m.step), float(m.value)) for m in history)


def wandb_records(folder: Path, run_id: str) -> list[Any]:
    """Every record of the run's offline ``.wandb`` files under ``folder`` (one file per attempt), oldest first."""
    from wandb.proto import wandb_internal_pb2 as pb

    # wandb names a folder offline-run-<second>-<id>, adding -1, -2... when two attempts start in one second
    pattern = re.compile(rf"offline-run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?$")
    found = []
    for path in glob.glob(str(folder / f"offline-run-*-{run_id}*" / f"run-{run_id}.wandb")):
        match = pattern.match(Path(path).parent.name)
        if match:
            found.append((match.group(1), int(match.group(2) or 0), path))
    paths = [path for *_, path in sorted(found)]
    out = []
    for path in paths:
        data = Path(path).read_bytes()
        assert data[:4] == b":W&B", path
        pos, part, block = 7, b"", 32768
        while pos + 7 <= len(data):
            left = block - pos % block
            if left < 7:
                pos += left
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            pos += 7
            if kind == 0 and length == 0:  # zero padding to the block's end
                pos += (block - pos % block) % block
                continue
            part += data[pos:pos + length]
            pos += length
            if kind in (1, 4):  # a full record, or the last piece of one
                record = pb.Record()
                record.ParseFromString(part)
                out.append(record)
                part = b""
    return out


def wandb_steps(records: list[Any], key: str) -> list[tuple[int, float]]:
    """(step, value) of ``key`` in the history records, in the order they were logged."""
    out = []
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
        if key in items:
            out.append((int(items["_step"]), float(items[key])))
    return out


def wait_stopped(pid: int, timeout_s: float = 60.0) -> None:
    """Wait until process ``pid`` is in the stopped state (``T`` in ``/proc/<pid>/stat``) after a SIGSTOP."""
    deadline = time.monotonic() + timeout_s
    while True:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] in "tT":
            return
        assert time.monotonic() < deadline, f"process {pid} did not stop within {timeout_s} s"
        time.sleep(0.01)


def wait_for(what: str, check: Any, timeout_s: float) -> float:
    """Poll ``check()`` until it is true; the seconds it took (failing after ``timeout_s``)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)
    return time.monotonic() - started
