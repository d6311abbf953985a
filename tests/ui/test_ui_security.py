"""Who may use the dashboard, read as curl or another local user would: every route needs the token (bearer or
the HttpOnly SameSite=Strict cookie the printed address sets), pages never carry it, POSTs from other origins are
refused, symbolic links are never followed (the token file, trial logs), short tokens are refused and a given one
is never stored, --read-only writes nothing, and ids beyond SQLite's integers are 404s."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the ui extra (starlette, uvicorn) is not installed")
httpx = pytest.importorskip("httpx")

from support.helpers_ui import login_url, make_store, running_ui  # noqa: E402

with warnings.catch_warnings():  # starlette 1.x asks for httpx2 in place of httpx; both work
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from determined_trials.cli.main import main  # noqa: E402
from determined_trials.core import LocalStore  # noqa: E402
from determined_trials.ui import MIN_TOKEN_LENGTH, TOKEN_FILE, UiSettings, create_app, load_or_create_token, serve  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

TOKEN = "0123456789abcdef-token"
LOCAL = "http://127.0.0.1:8080"
ROUTES = ["/", "/experiments/1", "/trials/1", "/static/app.js", "/static/style.css", "/api/v1/experiments",
          "/api/v1/experiments/1/trials", "/api/v1/trials/1/logs", "/api/v1/nothing"]
HUGE = "99999999999999999999999999"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    make_store(tmp_path / "runs").close()
    return tmp_path / "runs"


def _client(run_dir: Path, *, token: str | None = TOKEN, read_only: bool = False, base: str = LOCAL) -> TestClient:
    app = create_app(UiSettings(run_dir=run_dir, token=token, read_only=read_only))
    return TestClient(app, base_url=base, follow_redirects=False)


def _snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under ``folder`` with its size, mtime and mode: what a run that writes nothing leaves as it was.
    SQLite's own shared-memory and write-ahead files are left out: any reader of a WAL store makes them (as
    root here; another user needs them to exist, as they do while a run writes), the store file is not."""
    out = {}
    for path in folder.rglob("*"):
        if not path.name.endswith(("-wal", "-shm")):
            info = path.lstat()
            out[str(path.relative_to(folder))] = (info.st_size, info.st_mtime_ns, info.st_mode)
    return out


@pytest.mark.parametrize("path", ROUTES)
def test_every_route_needs_the_token(run_dir: Path, path: str) -> None:
    client = _client(run_dir)
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN},
                    {"Cookie": "det-ui-token-8080=wrong-token-0123456789"}, {"Cookie": f"det-ui-token-9000={TOKEN}"}):
        response = client.get(path, headers=headers)
        assert response.status_code == 401 and TOKEN not in response.text, (path, headers)
        assert response.headers["content-type"].startswith("application/json" if path.startswith("/api/")
                                                            else "text/html")
    wrong = client.get(path + "?token=wrong-token-0123456789")
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    assert client.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code in (200, 404)
    assert client.post("/api/v1/experiments/1/kill").status_code == 401
    assert LocalStore(run_dir).experiment(1).state == "ACTIVE"


def test_the_token_address_sets_a_strict_cookie_and_redirects(run_dir: Path) -> None:
    client = _client(run_dir)
    first = client.get(f"/experiments/1?x=1&token={TOKEN}")
    assert first.status_code == 303 and first.headers["location"] == "/experiments/1?x=1"
    assert TOKEN not in first.headers["location"] and TOKEN not in first.text
    cookie = first.headers["set-cookie"]
    parts = {p.strip().split("=")[0].lower(): p.strip() for p in cookie.split(";")}
    assert parts["det-ui-token-8080"] == f"det-ui-token-8080={TOKEN}"
    assert "httponly" in parts and parts["samesite"].lower() == "samesite=strict" and parts["path"] == "Path=/"
    page = client.get("/experiments/1?x=1")  # the cookie alone from now on
    assert page.status_code == 200 and TOKEN not in page.text and "det-ui-token" not in page.text
    assert client.get("/static/app.js").status_code == 200 and TOKEN not in client.get("/static/app.js").text
    assert client.get("/api/v1/experiments").json()["experiments"][0]["id"] == 1
    assert client.get("/?token=" + TOKEN).headers["location"] == "/"
    assert _client(run_dir, base="http://localhost:9000").get("/?token=" + TOKEN).headers["set-cookie"].startswith(
        "det-ui-token-9000=")  # one cookie per port: two dashboards on one machine do not log each other out


def test_posts_by_cookie_come_from_the_dashboard_only(run_dir: Path) -> None:
    client = _client(run_dir)
    client.get(f"/?token={TOKEN}")
    for origin in ("http://evil.example", "http://127.0.0.1:9000", "null", "http://localhost:8080"):
        response = client.post("/api/v1/experiments/1/kill", headers={"Origin": origin})
        assert response.status_code == 403 and "cross-origin" in response.json()["error"], origin
    assert LocalStore(run_dir).experiment(1).state == "ACTIVE"
    killed = client.post("/api/v1/experiments/1/kill", headers={"Origin": LOCAL})
    assert killed.status_code == 200 and killed.json()["state"] == "CANCELED"


def test_no_token_is_an_explicit_opt_out(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    client = _client(run_dir, token=None)
    assert all(client.get(path).status_code in (200, 404) for path in ROUTES)
    assert client.post("/api/v1/experiments/1/kill", headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.get("/", headers={"Host": "evil.example"}).status_code == 421
    assert main(["ui", "--run-dir", str(run_dir), "--host", "0.0.0.0", "--no-token", "--token", TOKEN]) == 2
    assert "--no-token and --token" in capsys.readouterr().err
    assert main(["ui", "--run-dir", str(run_dir), "--host", "0.0.0.0", "--no-token"]) == 2
    assert "only on 127.0.0.1" in capsys.readouterr().err
    with running_ui(run_dir, "--no-token") as (base, token):
        assert token == "" and httpx.get(base + "/api/v1/experiments", timeout=10).status_code == 200


@pytest.mark.parametrize("path", [
    f"/api/v1/experiments/{HUGE}", f"/api/v1/experiments/{HUGE}/trials", f"/api/v1/experiments/{HUGE}/metrics?metric=x",
    f"/api/v1/trials/{HUGE}", f"/api/v1/trials/{HUGE}/metrics", f"/api/v1/trials/{HUGE}/checkpoints",
    f"/api/v1/trials/{HUGE}/logs", "/api/v1/trials/9223372036854775808", "/api/v1/trials/9223372036854775807",
])
def test_ids_beyond_64_bits_are_json_404s(run_dir: Path, path: str) -> None:
    response = _client(run_dir).get(path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 404 and response.headers["content-type"] == "application/json"
    assert "not found" in response.json()["error"] and "Traceback" not in response.text


@pytest.mark.parametrize("action", ["pause", "activate", "kill"])
def test_actions_on_ids_beyond_64_bits_are_json_404s(run_dir: Path, action: str) -> None:
    response = _client(run_dir).post(f"/api/v1/experiments/{HUGE}/{action}",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 404 and "experiment" in response.json()["error"]


def test_a_symlinked_token_file_is_refused(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "someone-elses-file"
    target.write_text("x" * 40 + "\n")
    target.chmod(0o644)
    before = (target.read_text(), target.stat().st_mode, target.stat().st_mtime_ns)
    (run_dir / TOKEN_FILE).symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        load_or_create_token(run_dir)
    assert main(["ui", "--run-dir", str(run_dir), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and "x" * 40 not in err
    assert (target.read_text(), target.stat().st_mode, target.stat().st_mtime_ns) == before
    (run_dir / TOKEN_FILE).unlink()
    (run_dir / TOKEN_FILE).symlink_to(tmp_path / "not-yet")  # a dangling link: not created through either
    with pytest.raises(ValueError, match="symbolic link"):
        load_or_create_token(run_dir)
    assert not (tmp_path / "not-yet").exists()


def test_a_short_stored_token_or_a_non_file_is_refused(run_dir: Path) -> None:
    (run_dir / TOKEN_FILE).write_text("a\n")  # as `--token a` of an earlier version left it
    with pytest.raises(ValueError, match=f"at least {MIN_TOKEN_LENGTH} characters"):
        load_or_create_token(run_dir)
    (run_dir / TOKEN_FILE).unlink()
    (run_dir / TOKEN_FILE).mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        load_or_create_token(run_dir)


def _log_dir(run_dir: Path) -> Path:
    folder = run_dir / "experiments" / "1"
    folder.mkdir(parents=True)
    return folder


def test_a_symlinked_log_is_not_served(run_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text("the secret line\n")
    secret.chmod(0o600)
    (_log_dir(run_dir) / "trial_2.log").symlink_to(secret)
    client = _client(run_dir)
    response = client.get("/api/v1/trials/2/logs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.json() == {"trial_id": 2, "available": False, "lines": []} and "secret" not in response.text


def test_a_log_under_a_symlinked_folder_or_not_a_file_is_not_served(run_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "trial_2.log").write_text("the secret line\n")
    (run_dir / "experiments").mkdir()
    (run_dir / "experiments" / "1").symlink_to(elsewhere)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert _client(run_dir).get("/api/v1/trials/2/logs", headers=auth).json()["available"] is False
    (run_dir / "experiments" / "1").unlink()
    os.mkfifo(_log_dir(run_dir) / "trial_2.log")  # no writer: opening it for reading must not wait for one
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(
        _client(run_dir).get("/api/v1/trials/2/logs", headers=auth).json()), daemon=True)
    reader.start()
    reader.join(10)
    assert result == [{"trial_id": 2, "available": False, "lines": []}]


def test_short_tokens_are_refused_with_the_minimum(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for host in ("0.0.0.0", "127.0.0.1"):
        with pytest.raises(ValueError, match=f"at least {MIN_TOKEN_LENGTH} characters"):
            serve(run_dir, host=host, port=0, token="a")
        assert main(["ui", "--run-dir", str(run_dir), "--host", host, "--port", "0", "--token", "a" * 15]) == 2
        assert f"--token must be at least {MIN_TOKEN_LENGTH} characters (got 15)" in capsys.readouterr().err
    assert MIN_TOKEN_LENGTH == 16 and not (run_dir / TOKEN_FILE).exists()


def test_a_given_token_is_never_stored(run_dir: Path) -> None:
    kept = load_or_create_token(run_dir)
    before = _snapshot(run_dir)
    given = "given-on-the-command-line"
    with running_ui(run_dir, "--token", given) as (base, token):
        assert token == given
        assert httpx.get(base + "/api/v1/experiments", headers={"Authorization": f"Bearer {kept}"},
                         timeout=10).status_code == 401
        assert httpx.get(base + "/api/v1/experiments", headers={"Authorization": f"Bearer {given}"},
                         timeout=10).status_code == 200
    assert (run_dir / TOKEN_FILE).read_text().strip() == kept and _snapshot(run_dir) == before


def test_the_real_server_logs_in_by_cookie(run_dir: Path) -> None:
    with running_ui(run_dir) as (base, token):
        assert token == (run_dir / TOKEN_FILE).read_text().strip()
        for path in ROUTES:
            assert httpx.get(base + path, timeout=10).status_code == 401, path
        with httpx.Client(timeout=10) as browser:
            first = browser.get(login_url(base, token, "/experiments/1"))
            assert first.status_code == 303 and "HttpOnly" in first.headers["set-cookie"]
            page = browser.get(base + first.headers["location"])
            assert page.status_code == 200 and token not in page.text
            assert browser.get(base + "/api/v1/trials/1").json()["id"] == 1
            killed = browser.post(base + "/api/v1/experiments/1/kill", headers={"Origin": base})
            assert killed.status_code == 200 and killed.json()["state"] == "CANCELED"


def test_read_only_writes_nothing_in_the_run_folder(run_dir: Path) -> None:
    before = _snapshot(run_dir)
    with running_ui(run_dir, "--read-only") as (base, token):
        assert len(token) >= MIN_TOKEN_LENGTH
        assert httpx.get(base + "/api/v1/experiments", timeout=10).status_code == 401
        read = httpx.get(base + "/api/v1/experiments/1", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert read.status_code == 200 and read.json()["name"] == "demo"
        page = httpx.get(login_url(base, token), follow_redirects=True, timeout=10)
        assert page.status_code == 200 and token not in page.text and 'det-ui-read-only" content="1"' in page.text
    assert not (run_dir / TOKEN_FILE).exists() and _snapshot(run_dir) == before


@pytest.fixture
def unprivileged() -> Iterator[tuple[list[str], Path]]:
    """A command-line prefix running as `nobody`, and a folder that user can reach (but not write)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run the dashboard as another user")
    folder = Path(tempfile.mkdtemp(prefix="det-ui-other-user-"))
    folder.chmod(0o755)
    try:
        yield [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--"], folder
    finally:
        shutil.rmtree(folder)


def test_read_only_needs_only_read_access(run_dir: Path, unprivileged: tuple[list[str], Path]) -> None:
    """As a user who may read the store but write nothing (root owns the folder, mode 0755), while the store is
    open as a running experiment keeps it (its WAL files exist; a store closed cleanly in a folder the user may
    not write is beyond SQLite's WAL readers, see docs/ui.md)."""
    as_user, folder = unprivileged
    shared = folder / "runs"
    shutil.copytree(run_dir, shared)
    live = LocalStore(shared)
    live.experiments()
    for path in [shared, *shared.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    before = _snapshot(shared)
    with running_ui(shared, "--read-only", as_user=as_user) as (base, token):
        experiments = httpx.get(base + "/api/v1/experiments", headers={"Authorization": f"Bearer {token}"},
                                timeout=10)
        assert experiments.status_code == 200, experiments.text
        assert json.loads(experiments.text)["experiments"][0]["name"] == "demo"
    assert _snapshot(shared) == before and not (shared / TOKEN_FILE).exists()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    live.close()
