"""docs/integrations.md's Azure and GCS recipes run as written: the test reads the blocks from the page, starts
the documented server command, runs the documented set-up in bash and then checks the documented
``checkpoint_storage`` from that same shell. Only the port, the data folder and the venv's location change."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from support.helpers_buckets import azurite_path, free_port, gcs_emulator_path, missing_server
from support.helpers_load import load_factor
from support.helpers_paths import REPO

_DOC = REPO / "docs" / "integrations.md"
_BLOCK = re.compile(r"<!-- recipe: (?P<name>[\w-]+) -->\n```(?:bash|yaml)\n(?P<body>.*?)```", re.DOTALL)
_PORTS = {"azure": "10000", "gcs": "9023"}
_SERVERS = {"azure": ".venv/azurite/node_modules/.bin/azurite-blob", "gcs": ".venv/bin/gcp-storage-emulator"}
_CHECK = ("import sys, yaml; from determined_trials.core.storage import storage_from_spec; "
          "s = storage_from_spec(yaml.safe_load(sys.argv[1])['checkpoint_storage'], default_dir='.'); "
          "s.check(); assert s.list_checkpoints() == []; print('ready', s.describe())")


def recipes() -> dict[str, str]:
    """The page's recipe blocks by name."""
    return {m["name"]: m["body"] for m in _BLOCK.finditer(_DOC.read_text())}


def _local(text: str, kind: str, port: int, data: Path) -> str:
    """The block on this machine: a free port, a temporary data folder, the server and venv that run the tests."""
    venv_bin = Path(sys.executable).parent
    server = azurite_path() if kind == "azure" else gcs_emulator_path()
    text = text.replace(_SERVERS[kind], str(server)).replace(_PORTS[kind], str(port))
    text = text.replace("/tmp/azurite", str(data))
    if (venv_bin / "activate").exists():
        return text.replace(". .venv/bin/activate", f". {venv_bin}/activate")
    return text.replace(". .venv/bin/activate", f'export PATH="{venv_bin}:$PATH"')


@contextmanager
def _server(script: str, port: int) -> Iterator[None]:
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60 * load_factor()
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                err = proc.stderr.read().decode() if proc.poll() is not None and proc.stderr else ""
                assert proc.poll() is None and time.monotonic() < deadline, f"the server did not start: {err}"
                time.sleep(0.05)  # polling for the port
        yield
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_every_recipe_block_is_on_the_page() -> None:
    assert sorted(recipes()) == sorted(f"{kind}-{part}" for kind in _PORTS for part in ("server", "setup", "config"))
    assert "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;" \
        in recipes()["azure-setup"]  # the whole development key, not an ellipsis
    assert "--skipApiVersionCheck" in recipes()["azure-server"]


@pytest.mark.slow  # a server's start and two Python processes: 10-25 s on a loaded machine
@pytest.mark.parametrize("kind", ["azure", "gcs"])
def test_the_documented_recipe_runs_as_written(kind: str, tmp_path: Path) -> None:
    pytest.importorskip("azure.storage.blob" if kind == "azure" else "google.cloud.storage")
    if (azurite_path() if kind == "azure" else gcs_emulator_path()) is None:
        missing_server(f"{kind}'s emulator is not installed (make azurite / make venv)")
    blocks, port = recipes(), free_port()
    server = "\n".join(line for line in blocks[f"{kind}-server"].splitlines() if not line.startswith("make "))
    config = blocks[f"{kind}-config"]
    with _server(_local(server, kind, port, tmp_path / "data"), port):
        setup = _local(blocks[f"{kind}-setup"], kind, port, tmp_path / "data")
        done = subprocess.run(["bash", "-e", "-c", f"{setup}\npython -c {_quote(_CHECK)} {_quote(config)}"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300 * load_factor())
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ready {yaml.safe_load(config)['checkpoint_storage']} (endpoint http://127.0.0.1:{port}" in done.stdout, done.stdout


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
