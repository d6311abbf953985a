"""Serving the dashboard: the token (kept in the run folder, mode 0600, never through a symbolic link; or given,
or made for one read-only run), the loopback rule, uvicorn."""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import socket
import stat
from collections.abc import Callable
from pathlib import Path

from determined_trials.core.store import LocalStore

__all__ = ["MIN_TOKEN_LENGTH", "TOKEN_FILE", "check_token", "is_loopback", "listening_socket", "load_or_create_token",
           "serve"]

TOKEN_FILE = "ui_token"
MIN_TOKEN_LENGTH = 16


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address to bind) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_token(token: str, where: str = "--token") -> str:
    """``token`` if it is long enough to guess no faster than a made one; ``ValueError`` otherwise."""
    if len(token) < MIN_TOKEN_LENGTH or token != token.strip():
        raise ValueError(f"{where} must be at least {MIN_TOKEN_LENGTH} characters (got {len(token)}), without "
                         "spaces around it: use a random secret, e.g. python -c 'import secrets; "
                         "print(secrets.token_urlsafe(24))'")
    return token


def _read_token(path: Path) -> str | None:
    """The token kept at ``path`` (None when there is none); a symbolic link or a non-file is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{path} is a symbolic link: refusing to follow it (remove it; a new token is made)"
                             ) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ValueError(f"{path} is not a regular file: remove it (a new token is made)")
    with os.fdopen(fd, "rb") as kept:
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(kept.fileno(), 0o600)  # the file itself, never a link's target
        token = kept.read(4096).decode("utf-8", errors="replace").strip()
    return check_token(token, f"the token kept in {path}")


def load_or_create_token(run_dir: Path) -> str:
    """The token kept in ``run_dir/ui_token``, else a new random one written there (mode 0600, created only if
    no file or link has that name; a symbolic link there is refused, never followed)."""
    path = Path(run_dir) / TOKEN_FILE
    kept = _read_token(path)
    if kept is not None:
        return kept
    token = secrets.token_urlsafe(24)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # made meanwhile by another start, or a dangling link: read (or refuse) it
        return load_or_create_token(run_dir)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    return token


def _choose_token(run_dir: Path, token: str | None, no_token: bool, read_only: bool) -> tuple[str | None, str]:
    """The token this run checks and where it comes from: ``--token`` (never stored), none (``--no-token``), one
    made for a read-only run (which writes nothing), else the one kept in the run folder."""
    if no_token:
        return None, ""
    if token is not None:
        return token, "given with --token, not stored"
    if read_only:
        return secrets.token_urlsafe(24), "made for this read-only run, not stored"
    return load_or_create_token(run_dir), f"kept in {run_dir / TOKEN_FILE}, mode 0600"


def _check_options(host: str, token: str | None, no_token: bool) -> bool:
    """Whether ``host`` is loopback; ``ValueError`` for a weak token or a reachable host without one."""
    loopback = is_loopback(host)
    if no_token and token is not None:
        raise ValueError("--no-token and --token contradict each other: pass one")
    if no_token and not loopback:
        raise ValueError(f"--no-token serves without any check: only on 127.0.0.1, localhost or ::1, not --host {host}")
    if token is not None:
        check_token(token)
    elif not loopback and not no_token:
        raise ValueError(f"--host {host} is reachable from other machines: pass --token T (a secret every "
                         "request must bring), or serve on 127.0.0.1")
    return loopback


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening, with ``TCP_NODELAY`` (Nagle off): set on it, which the
    connections it accepts inherit, and made with ``IPPROTO_TCP`` so asyncio sets it on each of them as well.
    Without it a keep-alive client waited ~40 ms per request (Nagle holding the answer's last segment until
    the client's delayed ACK)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def serve(run_dir: Path, *, host: str = "127.0.0.1", port: int = 8080, token: str | None = None,
          no_token: bool = False, read_only: bool = False, say: Callable[[str], None] = print) -> None:
    """Serve the dashboard until interrupted; ``say`` gets the address and token lines once it listens.

    Every request must bring the token (the printed address carries it once) unless ``no_token``, which only
    loopback allows; a host other than loopback needs an explicit ``token``; a given token must have at least
    ``MIN_TOKEN_LENGTH`` characters (``ValueError`` otherwise).
    """
    import uvicorn

    from determined_trials.ui._app import UiSettings, create_app

    loopback = _check_options(host, token, no_token)
    run_dir = Path(run_dir).expanduser().absolute()
    LocalStore(run_dir, create=False).close()  # a clear error for a folder without a store, before any write
    secret, origin = _choose_token(run_dir, token, no_token, read_only)
    app = create_app(UiSettings(run_dir=run_dir, token=secret, read_only=read_only, loopback=loopback))
    sock = listening_socket(host, port)  # connections wait in the backlog from now on, while uvicorn starts
    family, bound = sock.family, sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if family == socket.AF_INET6 else host
    url = f"http://{shown}:{bound}/"
    say(f"det-trials ui: serving {run_dir} at {url}" + (f"?token={secret}" if secret else ""))
    suffix = "; read-only: actions are refused" if read_only else ""
    if secret is None:
        say("det-trials ui: WARNING: --no-token: no token is checked, so every user and program of this machine "
            "can read this dashboard" + ("" if read_only else " and pause, continue or kill its experiments") + suffix)
    else:
        say(f"det-trials ui: token {secret} ({origin}){suffix}")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
