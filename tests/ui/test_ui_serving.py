"""The dashboard's server as a long-running process: a run folder deleted or replaced under it is said (410, and
on the page), and its connections have Nagle off (TCP_NODELAY), so a keep-alive client waits no delayed ACK per
request."""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import socket
import time
import warnings
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the ui extra (starlette, uvicorn) is not installed")

from support.helpers_browser import chromium  # noqa: E402
from support.helpers_ui import login_url, make_store, running_ui  # noqa: E402

with warnings.catch_warnings():  # starlette 1.x asks for httpx2 in place of httpx; both work
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import determined_trials.ui._watch as _watch  # noqa: E402
from determined_trials.core import LocalStore  # noqa: E402
from determined_trials.ui import UiSettings, create_app  # noqa: E402
from determined_trials.ui._server import listening_socket  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

TOKEN = "s3cret-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CALLS = ["/api/v1/experiments", "/api/v1/experiments/1", "/api/v1/experiments/1/trials", "/api/v1/trials/1",
         "/api/v1/trials/1/metrics", "/api/v1/trials/1/checkpoints", "/api/v1/trials/1/logs",
         "/api/v1/experiments/1/metrics?metric=validation_loss"]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    make_store(tmp_path / "runs").close()
    return tmp_path / "runs"


def _client(run_dir: Path) -> TestClient:
    return TestClient(create_app(UiSettings(run_dir=run_dir, token=TOKEN)), base_url="http://127.0.0.1:8080",
                      headers=AUTH)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_run_folder_gone_under_the_app_is_a_410_everywhere(run_dir: Path, how: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_watch, "CHECK_EVERY_S", 0.0)
    client = _client(run_dir)
    assert all(client.get(path).status_code == 200 for path in CALLS)
    shutil.rmtree(run_dir)
    if how == "replaced":
        LocalStore(run_dir).close()  # an empty store where the old one was
    for path in CALLS:
        response = client.get(path)
        assert response.status_code == 410, (path, response.text)
        error = response.json()["error"]
        assert f"the run folder {run_dir} was {how}" in error and "restart det-trials ui" in error
    kill = client.post("/api/v1/experiments/1/kill")
    assert kill.status_code == 410 and "restart det-trials ui" in kill.json()["error"]
    assert client.get("/").status_code == 200  # the page itself loads, and its script shows the 410


def test_the_store_is_checked_at_most_every_half_second(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    real = _watch._identity
    monkeypatch.setattr(_watch, "_identity", lambda path: calls.append(path) or real(path))
    client = _client(run_dir)
    for _ in range(20):
        assert client.get("/api/v1/experiments").status_code == 200
    assert len(calls) <= 3  # the first look, and at most one per half second of these quick requests


def test_the_real_server_says_its_run_folder_was_deleted(run_dir: Path) -> None:
    with running_ui(run_dir) as (base, token):
        host, port = base.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/api/v1/experiments", headers={"Authorization": f"Bearer {token}"})
        assert conn.getresponse().read() and conn.sock is not None
        shutil.rmtree(run_dir)
        deadline = time.monotonic() + 10
        while True:
            conn.request("GET", "/api/v1/experiments", headers={"Authorization": f"Bearer {token}"})
            response = conn.getresponse()
            body = json.loads(response.read())
            if response.status != 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        conn.close()
    assert response.status == 410, body
    assert "was deleted" in body["error"] and "restart det-trials ui" in body["error"]


def test_the_listening_socket_and_what_it_accepts_have_nagle_off() -> None:
    sock = listening_socket("127.0.0.1", 0)
    with sock, socket.create_connection(sock.getsockname()) as _client_side:
        accepted, _ = sock.accept()
        with accepted:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_connections_served_through_asyncio_on_that_socket_have_nagle_off() -> None:
    """uvicorn serves the pre-bound socket with ``loop.create_server(sock=...)``: each connection's transport
    socket must have TCP_NODELAY (asyncio sets it only on sockets made with IPPROTO_TCP)."""
    seen: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            seen.append(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Probe, sock=listening_socket("127.0.0.1", 0))
        async with server:
            host, port = server.sockets[0].getsockname()[:2]
            _, writer = await asyncio.open_connection(host, port)
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(main())
    assert seen and seen[0] != 0


def test_the_page_says_its_run_folder_is_gone(run_dir: Path) -> None:
    with chromium() as browser, running_ui(run_dir) as (base, token):
        page = browser.new_page(bypass_csp=True)
        page.set_default_timeout(30_000)
        page.goto(login_url(base, token, "/experiments/1"))
        page.wait_for_selector('#trials tbody tr[data-id="3"]')
        assert page.text_content("#live") == "live"
        shutil.rmtree(run_dir)
        page.wait_for_selector("#live:has-text('run folder gone')")
        assert "restart det-trials ui" in str(page.text_content("#error"))
