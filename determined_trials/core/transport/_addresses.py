"""Where a job's collective sockets live, chosen so that two jobs on one host never collide: unix
sockets named after the job on one machine, a per-job TCP port across machines."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import ipaddress
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

__all__ = [
    "DEFAULT_PORT", "JobKey", "WRAP_RANK_PARENT_ENV", "WRAP_RANK_PID_ENV",
    "ensure_unused", "ipc_endpoint", "ipc_supported", "job_key", "tcp_bind_endpoint",
    "tcp_connect_endpoint", "tcp_port",
]

DEFAULT_PORT = 12360
_MAX_UNIX_PATH = 100  # sun_path holds 104-108 bytes depending on the OS
_STALE_AGE_S = 3600.0


class JobKey:
    """What identifies this job among the jobs on a host (``shared``: the same on every machine)."""

    def __init__(self, key: str, shared: bool) -> None:
        self.key = key
        self.shared = shared
        self.digest = hashlib.sha256(key.encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"JobKey({self.key!r})"


def job_key(size: int) -> JobKey:
    """DET_JOB_ID, else the torchrun/deepspeed rendezvous (MASTER_ADDR:MASTER_PORT, run id), else the
    launching process (parent pid) and the job size."""
    job = os.environ.get("DET_JOB_ID")
    if job:
        return JobKey(f"job:{job}", shared=True)
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
        return JobKey(f"master:{addr}:{port}:{run_id}", shared=True)
    return JobKey(f"parent:{_launching_pid()}:{size}", shared=False)


WRAP_RANK_PID_ENV = "DET_WRAP_RANK_PID"
WRAP_RANK_PARENT_ENV = "DET_WRAP_RANK_PARENT_PID"


def _launching_pid() -> int:
    """The process that started this rank: the parent, or, when the parent is a ``wrap_rank`` (which
    sets these variables), wrap_rank's own parent, so that all ranks of one launcher agree."""
    parent = os.getppid()
    if os.environ.get(WRAP_RANK_PID_ENV) == str(parent):
        launcher = os.environ.get(WRAP_RANK_PARENT_ENV, "")
        if launcher.isdigit():
            return int(launcher)
    return parent


def ipc_supported() -> bool:
    """Unix sockets exist on this platform."""
    return hasattr(socket, "AF_UNIX") and sys.platform != "win32"


def ipc_endpoint(name: str) -> str:
    """``ipc://`` endpoint for the socket called ``name`` in this user's folder of the temp dir; raises
    when a live process already listens there (another job with the same key)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    folder = Path(tempfile.gettempdir()) / f"det-trials-{uid}"
    path = folder / f"{name}.sock"
    if len(str(path)) > _MAX_UNIX_PATH:
        if sys.platform.startswith("linux"):  # the abstract namespace has no path-length problem
            return f"ipc://@det-trials-{uid}-{name}"
        raise OSError(errno.ENAMETOOLONG, f"unix socket path too long: {path}; set TMPDIR to a short folder")
    folder.mkdir(mode=0o700, exist_ok=True)
    return f"ipc://{path}"


def _listening(path: str) -> bool:
    """A live process accepts connections on the unix socket at ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _sweep_stale(folder: Path) -> None:
    """Remove old socket files whose job was killed (libzmq does not remove them)."""
    cutoff = time.time() - _STALE_AGE_S
    for entry in folder.glob("*.sock"):
        with contextlib.suppress(OSError):
            if entry.stat().st_mtime < cutoff and not _listening(str(entry)):
                entry.unlink()


def ensure_unused(endpoint: str, job: JobKey) -> None:
    """Raise if a live process already listens on the unix socket of ``endpoint`` (another job with the
    same key); tidy up socket files that killed jobs left in the folder."""
    path = endpoint.removeprefix("ipc://")
    if path.startswith("@"):
        return
    _sweep_stale(Path(path).parent)
    if not os.path.exists(path) or not _listening(path):
        return  # nothing there, or a stale file that the new bind replaces
    raise RuntimeError(
        f"another job is already running with the same job key ({job.key}; socket {path}). Give each "
        "concurrent job its own DET_JOB_ID (or MASTER_PORT), or close the previous DistributedContext first."
    )


def tcp_port(pub_port: int | None, port_offset: int) -> int:
    """``pub_port``, else DET_CORE_PORT, else MASTER_PORT + 1, else 12360; plus ``port_offset``."""
    if pub_port is not None:
        base, source = pub_port, "pub_port"
    elif os.environ.get("DET_CORE_PORT"):
        base, source = _env_int("DET_CORE_PORT"), "DET_CORE_PORT"
    elif os.environ.get("MASTER_PORT"):
        base, source = _env_int("MASTER_PORT") + 1, "MASTER_PORT + 1"
    else:
        base, source = DEFAULT_PORT, "the default port"
    port = base + port_offset
    if not 0 < port < 65536:
        raise ValueError(f"collective port {port} ({source} {base} + port_offset {port_offset}) is not in 1..65535")
    return port


def _env_int(name: str) -> int:
    raw = os.environ[name]
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def tcp_connect_endpoint(chief_ip: str, port: int) -> str:
    """Where workers find the chief."""
    return f"tcp://{_host(chief_ip)}:{port}"


def tcp_bind_endpoint(chief_ip: str, port: int) -> str:
    """Where the chief listens: loopback only when the job is local, else every interface."""
    try:
        loopback = ipaddress.ip_address(chief_ip).is_loopback
    except ValueError:
        loopback = chief_ip == "localhost"
    if loopback:
        return f"tcp://{_host('127.0.0.1' if chief_ip == 'localhost' else chief_ip)}:{port}"
    return f"tcp://*:{port}"

