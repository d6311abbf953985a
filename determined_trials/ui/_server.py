"""Serving the dashboard: the token kept in the run folder (mode 0600), the loopback rule, uvicorn."""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path

from determined_trials.core.store._local import LocalStore

__all__ = ["TOKEN_FILE", "is_loopback", "load_or_create_token", "serve"]

TOKEN_FILE = "ui_token"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address to bind) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_or_create_token(run_dir: Path, token: str | None = None) -> str:
    """The POST token: ``token`` if given, else the one kept in the run folder, else a new random one; the
    one used is (re)written to ``run_dir/ui_token`` readable by its owner only."""
    path = Path(run_dir) / TOKEN_FILE
    if token is None and path.is_file():
        token = path.read_text(encoding="utf-8").strip() or None
    token = token or secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def serve(run_dir: Path, *, host: str = "127.0.0.1", port: int = 8080, token: str | None = None,
          read_only: bool = False, say: Callable[[str], None] = print) -> None:
    """Serve the dashboard until interrupted; ``say`` gets the address and token lines once it listens.

    A host other than loopback needs an explicit ``token`` (``ValueError`` otherwise).
    """
    import uvicorn

    from determined_trials.ui._app import UiSettings, create_app

    loopback = is_loopback(host)
    if not loopback and not token:
        raise ValueError(f"--host {host} is reachable from other machines: pass --token T (a secret every "
                         "request must bring), or serve on 127.0.0.1")
    run_dir = Path(run_dir).expanduser().absolute()
    LocalStore(run_dir, create=False).close()  # a clear error for a folder without a store, before any write
    settings = UiSettings(run_dir=run_dir, token=load_or_create_token(run_dir, token), read_only=read_only,
                          loopback=loopback)
    app = create_app(settings)
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)  # connections wait in the backlog from now on, while uvicorn starts
    bound = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if family == socket.AF_INET6 else host
    url = f"http://{shown}:{bound}/"
    say(f"det-trials ui: serving {run_dir} at {url}" + ("" if loopback else f"?token={settings.token}"))
    say(f"det-trials ui: token {settings.token} (kept in {run_dir / TOKEN_FILE}, mode 0600)"
        + ("; read-only: actions are refused" if read_only else ""))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
