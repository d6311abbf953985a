"""The dashboard's JSON API (Starlette's TestClient, and `det-trials ui` as a real server): every endpoint,
unknown ids, downsampling, the token, read-only, non-loopback hosts and paths outside the static folder
(test_ui_security.py: the cookie, symbolic links, weak tokens, read-only without writes, huge ids)."""

from __future__ import annotations

import json
import math
import os
import stat
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the ui extra (starlette, uvicorn) is not installed")

from support.helpers_ui import add_origins, make_store, running_ui  # noqa: E402

with warnings.catch_warnings():  # starlette 1.x asks for httpx2 in place of httpx; both work
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from determined_trials.cli.main import main  # noqa: E402
from determined_trials.core import LocalStore  # noqa: E402
from determined_trials.ui import TOKEN_FILE, UiSettings, create_app, is_loopback, load_or_create_token, serve  # noqa: E402
from determined_trials.ui._downsample import keep_indices  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

TOKEN = "s3cret-token-0123456789"
LOCAL = "http://127.0.0.1:8080"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    make_store(tmp_path / "runs").close()
    return tmp_path / "runs"


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _client(run_dir: Path, *, read_only: bool = False, loopback: bool = True, base: str = LOCAL,
            auth: bool = True) -> TestClient:
    """A client of the app; with ``auth`` every request brings the token (as API clients send it)."""
    app = create_app(UiSettings(run_dir=run_dir, token=TOKEN, read_only=read_only, loopback=loopback))
    return TestClient(app, base_url=base, headers=AUTH if auth else None)


def test_experiments_list_and_one_experiment(run_dir: Path) -> None:
    client = _client(run_dir)
    listed = client.get("/api/v1/experiments").json()["experiments"]
    assert [e["id"] for e in listed] == [1]
    exp = listed[0]
    assert exp["name"] == "demo" and exp["state"] == "ACTIVE" and exp["kind"] == "script" and not exp["running"]
    assert exp["trial_counts"] == {"ACTIVE": 2, "COMPLETED": 1} and exp["num_trials"] == 3
    assert exp["best_metric"] == pytest.approx(0.2) and exp["searcher"]["metric"] == "validation_loss"
    assert exp["progress"] == pytest.approx((1 + 0.5 + 0.5) / 3)
    one = client.get("/api/v1/experiments/1").json()
    assert one["config"]["searcher"]["name"] == "grid"
    assert one["metric_names"] == {"training": ["accuracy", "loss"], "validation": ["validation_loss"]}


def test_an_experiment_names_its_log_scaled_and_searched_hyperparameters(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "runs")
    hparams = {"lr": {"type": "log", "minval": -4, "maxval": -1}, "width": {"type": "int", "minval": 1, "maxval": 8},
               "optim": {"decay": {"type": "log", "minval": -6, "maxval": -2, "base": 10}, "kind": "adam"}, "seed": 3,
               "one": {"type": "categorical", "vals": [1]}, "fixed": {"type": "const", "val": 2}}
    store.create_experiment(name="log", config={"hyperparameters": hparams})
    store.create_experiment(name="none", config={})
    store.close()
    client = _client(tmp_path / "runs")
    one = client.get("/api/v1/experiments/1").json()
    assert one["log_hparams"] == ["lr", "optim.decay"]
    assert one["searched_hparams"] == ["lr", "width", "optim.decay"]
    assert client.get("/api/v1/experiments/2").json()["log_hparams"] == []


def test_an_optuna_experiment_serves_param_importances_from_ten_completed_trials(tmp_path: Path) -> None:
    """From the study recorded in the searcher state the runner saves: none at 9 completed trials, Optuna's
    importances of the searched hyperparameters at 10 (the answer cached by count is computed again)."""
    pytest.importorskip("optuna")
    from determined_trials.config import load_config
    from determined_trials.searcher import make_searcher

    config = {"searcher": {"name": "optuna", "metric": "loss", "max_trials": 10, "max_length": 1},
              "hyperparameters": {"x": {"type": "double", "minval": -2, "maxval": 2},
                                  "y": {"type": "int", "minval": 0, "maxval": 9}, "z": {"type": "const", "val": 1}},
              "reproducibility": {"experiment_seed": 4}}
    searcher = make_searcher(load_config(config))
    store = LocalStore(tmp_path / "runs")
    store.create_experiment(name="optuna", config=config)
    client = _client(tmp_path / "runs")
    pending = list(searcher.initial_trials())
    for done in range(1, 11):
        request = pending.pop(0)
        pending += searcher.on_validation(request.request_id, 1, request.hparams["x"] ** 2 + 0.01 * request.hparams["y"])
        store.set_searcher_state(1, {"searcher": searcher.state_dict()})
        if done in (1, 9):
            assert client.get("/api/v1/experiments/1").json()["param_importances"] is None
    found = client.get("/api/v1/experiments/1").json()["param_importances"]
    assert set(found) == {"x", "y"} and sum(found.values()) == pytest.approx(1.0)
    assert list(found.values()) == sorted(found.values(), reverse=True)
    store.close()


def test_trials_of_an_experiment(run_dir: Path) -> None:
    data = _client(run_dir).get("/api/v1/experiments/1/trials").json()
    trials = data["trials"]
    assert [t["id"] for t in trials] == [1, 2, 3]
    assert trials[1]["hparams"] == {"lr": pytest.approx(0.2), "opt": "adam", "net": {"width": 16}}
    assert [t["batches"] for t in trials] == [50, 50, 50]
    assert [t["best_metric"] for t in trials] == pytest.approx([0.2, 0.3, 0.4])
    assert trials[0]["state"] == "COMPLETED" and trials[0]["restarts"] == 0


def test_one_trial_its_checkpoints_and_no_log(run_dir: Path) -> None:
    client = _client(run_dir)
    trial = client.get("/api/v1/trials/2").json()
    assert trial["experiment_name"] == "demo" and trial["metric_groups"] == ["training", "validation"]
    assert trial["best_metric"] == pytest.approx(0.3) and trial["config"]["name"] == "demo"
    ckpts = client.get("/api/v1/trials/2/checkpoints").json()["checkpoints"]
    assert [(c["uuid"], c["steps_completed"], c["state"], c["size"]) for c in ckpts] == [
        ("ckpt-2-00000000", 50, "COMPLETED", 1546)]
    assert client.get("/api/v1/trials/2/logs").json() == {"trial_id": 2, "available": False, "lines": []}
    assert trial["trackers"] == {}


def test_a_trial_names_its_tracker_runs(run_dir: Path) -> None:
    url = "http://127.0.0.1:5000/#/experiments/1/runs/abc"
    LocalStore(run_dir).set_tracker_run(2, "mlflow", "abc", url)
    assert _client(run_dir).get("/api/v1/trials/2").json()["trackers"] == {"mlflow": {"run_id": "abc", "url": url}}


def test_a_fork_and_warm_started_searches_name_their_origin(run_dir: Path) -> None:
    """The lineage fields the page links back from: a fork's parent trial and checkpoint (on its trial and its
    experiment), a warm start's checkpoint and trial, an optuna study's earlier experiments."""
    store = LocalStore(run_dir)
    fork, child, warm = add_origins(store)
    store.set_searcher_state(warm, {"warm_start": {"checkpoint": "ckpt-2-00000000", "trial_id": 2}})
    warm_trial = store.create_trial(experiment_id=warm, hparams={}, seed=1)
    client = _client(run_dir)
    parent = {"trial_id": 2, "experiment_id": 1, "checkpoint": "ckpt-2-00000000"}
    assert client.get(f"/api/v1/trials/{child}").json()["origin"] == {"kind": "fork", **parent}
    assert client.get(f"/api/v1/experiments/{fork}").json()["origins"] == [{"kind": "fork", **parent}]
    assert client.get(f"/api/v1/trials/{warm_trial}").json()["origin"] == {"kind": "warm_start", **parent}
    assert client.get(f"/api/v1/experiments/{warm}").json()["origins"] == [
        {"kind": "warm_start", **parent}, {"kind": "study", "experiments": [1, fork]}]
    assert client.get("/api/v1/trials/1").json()["origin"] is None  # a trial of a plain search
    assert client.get("/api/v1/experiments/1").json()["origins"] == []


def test_log_tail_reads_the_runners_log(run_dir: Path) -> None:
    log = run_dir / "experiments" / "1" / "trial_2.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))
    client = _client(run_dir)
    assert client.get("/api/v1/trials/2/logs?tail=3").json()["lines"] == ["line 99997", "line 99998", "line 99999"]
    assert len(client.get("/api/v1/trials/2/logs").json()["lines"]) == 200
    assert client.get("/api/v1/trials/2/logs?tail=0").json()["lines"] == []
    assert client.get("/api/v1/trials/2/logs?tail=-1").status_code == 400


def test_metrics_of_a_trial_and_of_an_experiment(run_dir: Path) -> None:
    client = _client(run_dir)
    training = client.get("/api/v1/trials/1/metrics?group=training").json()
    assert set(training["series"]) == {"accuracy", "loss"}
    assert training["series"]["loss"]["steps"] == list(range(1, 51))
    validation = client.get("/api/v1/trials/1/metrics?group=validation").json()["series"]["validation_loss"]
    assert validation["values"][0] == pytest.approx(2.0) and len(validation["steps"]) == 10
    curves = client.get("/api/v1/experiments/1/metrics?group=validation&metric=validation_loss").json()
    assert set(curves["trials"]) == {"1", "2", "3"} and curves["trials"]["3"]["values"][-1] == pytest.approx(0.4)
    assert client.get("/api/v1/experiments/1/metrics?group=validation").status_code == 400


def test_downsampling_keeps_first_last_and_extremes(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    exp = store.create_experiment(name="wiggly", config={})
    tid = store.create_trial(experiment_id=exp, hparams={}, seed=0)
    values = [math.sin(i / 50.0) * (1 + i / 1000) for i in range(5000)]
    values[1234], values[4321] = 99.0, -99.0
    store.add_metrics_reports(trial_id=tid, reports=[
        {"group": "training", "steps_completed": i, "metrics": {"loss": v}, "reported_time": 0.0}
        for i, v in enumerate(values)])
    client = _client(tmp_path)
    for n in (2, 3, 10, 101, 500):
        series = client.get(f"/api/v1/trials/{tid}/metrics?group=training&max_points={n}").json()["series"]["loss"]
        assert 2 <= len(series["values"]) <= n
        assert series["steps"][0] == 0 and series["steps"][-1] == 4999
        assert series["steps"] == sorted(series["steps"])
        if n >= 4:
            assert 99.0 in series["values"] and -99.0 in series["values"]
    assert client.get(f"/api/v1/trials/{tid}/metrics?max_points=1").status_code == 400
    assert client.get(f"/api/v1/trials/{tid}/metrics?max_points=x").status_code == 400
    assert keep_indices([1.0, 2.0, 3.0], 10) == [0, 1, 2]


def test_keep_indices_on_random_series() -> None:
    import random

    rng = random.Random(5)
    for _ in range(300):
        values = [rng.uniform(-1, 1) for _ in range(rng.randint(0, 3000))]
        limit = rng.randint(2, 400)
        kept = keep_indices(values, limit)
        assert kept == sorted(set(kept)) and len(kept) <= max(limit, 2)
        if values:
            assert kept[0] == 0 and kept[-1] == len(values) - 1
        if len(values) > limit >= 4:
            shown = [values[i] for i in kept]
            assert min(shown) == min(values) and max(shown) == max(values)
        if len(values) <= limit:
            assert kept == list(range(len(values)))


def test_non_finite_metrics_are_left_out(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    exp = store.create_experiment(name="nan", config={"searcher": {"metric": "loss"}})
    tid = store.create_trial(experiment_id=exp, hparams={"x": 1}, seed=0)
    for step, value in enumerate([3.0, float("nan"), float("inf"), 1.0], start=1):
        store.add_metrics(trial_id=tid, group="validation", steps_completed=step, metrics={"loss": value, "n": step})
    client = _client(tmp_path)
    series = client.get(f"/api/v1/trials/{tid}/metrics?group=validation").json()["series"]
    assert series["loss"]["steps"] == [1, 4] and series["n"]["steps"] == [1, 2, 3, 4]
    assert client.get(f"/api/v1/experiments/{exp}/trials").json()["trials"][0]["best_metric"] == 1.0
    curve = client.get(f"/api/v1/experiments/{exp}/metrics?metric=loss").json()["trials"][str(tid)]
    assert curve == {"steps": [1, 4], "values": [3.0, 1.0]}


@pytest.mark.parametrize("path", [
    "/api/v1/experiments/9", "/api/v1/experiments/9/trials", "/api/v1/experiments/9/metrics?metric=loss",
    "/api/v1/trials/9", "/api/v1/trials/9/metrics", "/api/v1/trials/9/checkpoints", "/api/v1/trials/9/logs",
    "/api/v1/nothing", "/api/v2/experiments",
])
def test_unknown_ids_and_paths_are_json_404s(run_dir: Path, path: str) -> None:
    response = _client(run_dir).get(path)
    assert response.status_code == 404 and response.headers["content-type"] == "application/json"
    assert response.json()["error"]


def test_posts_need_the_token(run_dir: Path) -> None:
    client = _client(run_dir, auth=False)
    assert client.post("/api/v1/experiments/1/kill").status_code == 401
    assert client.post("/api/v1/experiments/1/kill", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/api/v1/experiments/1/kill", headers={"Authorization": TOKEN}).status_code == 401
    assert LocalStore(run_dir).experiment(1).state == "ACTIVE"


def test_read_only_refuses_every_post(run_dir: Path) -> None:
    client = _client(run_dir, read_only=True)
    for action in ("pause", "activate", "kill", "nothing"):
        response = client.post(f"/api/v1/experiments/1/{action}", headers=AUTH)
        assert response.status_code == 403 and "read-only" in response.json()["error"]
    assert LocalStore(run_dir).experiment(1).state == "ACTIVE"
    assert 'content="1"' in client.get("/").text


def test_actions_answer_with_the_state_or_a_conflict(run_dir: Path) -> None:
    client = _client(run_dir)
    paused = client.post("/api/v1/experiments/1/pause", headers=AUTH)
    assert paused.status_code == 409 and "plain script" in paused.json()["error"]
    assert client.post("/api/v1/experiments/1/activate", headers=AUTH).status_code == 409
    assert client.post("/api/v1/experiments/1/explode", headers=AUTH).status_code == 404
    assert client.post("/api/v1/experiments/7/kill", headers=AUTH).status_code == 404
    killed = client.post("/api/v1/experiments/1/kill", headers=AUTH)
    assert killed.status_code == 200 and killed.json() == {"experiment_id": 1, "action": "kill", "state": "CANCELED"}
    assert {t.state for t in LocalStore(run_dir).trials(1)} == {"COMPLETED", "CANCELED"}
    assert client.post("/api/v1/experiments/1/kill", headers=AUTH).status_code == 409


def test_the_page_never_carries_the_token(run_dir: Path) -> None:
    page = _client(run_dir).get("/experiments/1")
    assert page.status_code == 200 and TOKEN not in page.text and "det-ui-token" not in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for base in ("http://localhost:8080", "http://[::1]:9000", "http://127.0.0.1"):
        assert TOKEN not in _client(run_dir, base=base).get("/").text


@pytest.mark.parametrize("path", ["/", "/experiments/1", f"/?token={TOKEN}", "/api/v1/experiments", "/static/app.js"])
def test_on_loopback_other_host_names_are_refused(run_dir: Path, path: str) -> None:
    """A page whose name was pointed at 127.0.0.1 (DNS rebinding) reads nothing, the token least of all."""
    for base in ("http://evil.example:8080", "http://evil.example", "http://127.0.0.1.evil.example:8080"):
        response = _client(run_dir, base=base).get(path)
        assert response.status_code == 421 and TOKEN not in response.text
    for host in ("127.0.0.1:8765@evil.com", "localhost:evil", "localhost:", "127.0.0.1:99999", "[::1]x",
                 "localhost:80:80", "localhost evil", ""):
        response = _client(run_dir).get(path, headers={"Host": host})
        assert response.status_code == 421 and TOKEN not in response.text, host
    response = _client(run_dir, base="http://evil.example:8080").post("/api/v1/experiments/1/kill", headers=AUTH)
    assert response.status_code == 421 and LocalStore(run_dir).experiment(1).state == "ACTIVE"


def test_a_non_loopback_server_wants_the_token_everywhere(run_dir: Path) -> None:
    client = _client(run_dir, loopback=False, base="http://10.1.2.3:8080", auth=False)
    assert client.get("/").status_code == 401 and TOKEN not in client.get("/").text
    assert client.get("/api/v1/experiments").status_code == 401
    assert client.get("/api/v1/experiments", headers=AUTH).status_code == 200
    assert client.get("/static/app.js").status_code == 401
    page = client.get(f"/trials/1?token={TOKEN}")  # follows the redirect, with the cookie it set
    assert page.status_code == 200 and str(page.url) == "http://10.1.2.3:8080/trials/1" and TOKEN not in page.text
    assert client.get("/static/app.js").status_code == 200


def test_a_non_loopback_host_without_a_token_is_refused(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.com")
    with pytest.raises(ValueError, match="--token"):
        serve(run_dir, host="0.0.0.0", port=0)
    assert main(["ui", "--run-dir", str(run_dir), "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "--token" in capsys.readouterr().err
    assert not (run_dir / TOKEN_FILE).exists()


def test_the_pause_and_activate_commands(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--run-dir", str(run_dir), "experiment", "pause", "1"]) == 2
    assert "plain script" in capsys.readouterr().err
    assert main(["--run-dir", str(run_dir), "experiment", "activate", "1"]) == 2
    assert "not a paused experiment" in capsys.readouterr().err
    assert main(["--run-dir", str(run_dir), "experiment", "pause", "5"]) == 2


def test_the_token_file_is_private(tmp_path: Path) -> None:
    token = load_or_create_token(tmp_path)
    path = tmp_path / TOKEN_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and path.read_text().strip() == token
    assert load_or_create_token(tmp_path) == token and len(token) >= 32
    path.chmod(0o644)
    assert load_or_create_token(tmp_path) == token and stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.parametrize("path", [
    "/static/../store.sqlite", "/static/%2e%2e/store.sqlite", "/static/..%2fstore.sqlite",
    "/static/%2e%2e%2f%2e%2e%2f_app.py", "/static/..%2f_app.py", "/static//etc/passwd", "/static/%2fetc%2fpasswd",
    "/static/....//_app.py", "/static/%252e%252e/_app.py", "/store.sqlite", "/ui_token", "/experiments/1/../../ui_token",
    "/static/", "/static",
])
def test_nothing_outside_the_static_folder_is_served(run_dir: Path, path: str) -> None:
    (run_dir / TOKEN_FILE).write_text(TOKEN + "\n")
    response = _client(run_dir).get(path)
    assert response.status_code in (404, 405), (path, response.status_code)
    assert TOKEN not in response.text and "SQLite" not in response.text and "import" not in response.text


def test_the_real_server_prints_its_address_and_serves(run_dir: Path) -> None:
    with running_ui(run_dir) as (base, token):
        assert base.startswith("http://127.0.0.1:")
        read = urllib.request.Request(base + "/api/v1/experiments", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(read, timeout=10) as response:
            assert json.load(response)["experiments"][0]["name"] == "demo"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(base + "/api/v1/experiments/1/kill", method="POST"),
                                   timeout=10)
        assert refused.value.code == 401
        request = urllib.request.Request(base + "/api/v1/experiments/1/kill", method="POST",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.load(response)["state"] == "CANCELED"
    assert (run_dir / TOKEN_FILE).read_text().strip() == token


def test_the_real_server_read_only(run_dir: Path) -> None:
    with running_ui(run_dir, "--read-only") as (base, token):
        request = urllib.request.Request(base + "/api/v1/experiments/1/kill", method="POST",
                                         headers={"Authorization": f"Bearer {token}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_device")
def test_a_plain_trainer_fit_run(tmp_path: Path) -> None:
    from trials_pytorch import LinearTrial, config, fit

    from determined_trials.pytorch import Batch

    _, _, info = fit(LinearTrial, config({"lr": 0.05}), tmp_path, max_length=Batch(8))
    client = _client(tmp_path)
    exp = client.get("/api/v1/experiments").json()["experiments"][0]
    assert exp["kind"] == "script" and exp["state"] == "COMPLETED" and exp["best_metric"] is not None
    trial = client.get(f"/api/v1/experiments/{exp['id']}/trials").json()["trials"][0]
    assert trial["id"] == info["trial_id"] and trial["hparams"]["lr"] == 0.05 and trial["batches"] == 8
    series = client.get(f"/api/v1/trials/{trial['id']}/metrics?group=training").json()["series"]
    assert "loss" in series and series["loss"]["steps"][-1] == 8
    validation = client.get(f"/api/v1/trials/{trial['id']}/metrics?group=validation").json()["series"]
    assert "validation_loss" in validation
    uuids = [c["uuid"] for c in client.get(f"/api/v1/trials/{trial['id']}/checkpoints").json()["checkpoints"]]
    assert uuids == [c.uuid for c in info["checkpoints"]] and uuids


_TIME_KEYS = {"queued", "start", "build", "train", "data_wait", "validation", "checkpoint", "restore", "replay",
              "other", "wall"}


def test_api_time_of_a_trial_and_its_experiment(run_dir: Path) -> None:
    store = LocalStore(run_dir)
    store.add_trial_time(1, {"queued": 1.0, "start": 2.0, "train": 6.0, "replay": 1.0, "wall": 12.0})
    store.add_trial_time(2, {"build": 1.0, "train": 2.0, "validation": 0.5, "checkpoint": 0.5, "wall": 4.0})
    client = _client(run_dir)
    trial = client.get("/api/v1/trials/1").json()["time"]
    assert set(trial) == _TIME_KEYS
    assert (trial["train"], trial["replay"], trial["other"], trial["wall"]) == (6.0, 1.0, 2.0, 12.0)
    summed = client.get("/api/v1/experiments/1").json()["time"]
    assert set(summed) == _TIME_KEYS | {"goodput"}
    assert (summed["train"], summed["other"], summed["wall"]) == (8.0, 2.0, 16.0)
    assert summed["goodput"] == pytest.approx(0.5)
    assert client.get("/api/v1/trials/3").json()["time"]["wall"] == 0.0  # nothing recorded: zeros


@pytest.mark.usefixtures("cpu_device")
def test_api_time_of_a_plain_trainer_fit(tmp_path: Path) -> None:
    """A plain script's fit (no runner): the loop's parts, no queue or process start, its wall their sum."""
    from trials_pytorch import LinearTrial, config, fit

    from determined_trials.pytorch import Batch

    _, _, info = fit(LinearTrial, config({"lr": 0.05}), tmp_path, max_length=Batch(8))
    spent = _client(tmp_path).get(f"/api/v1/trials/{info['trial_id']}").json()["time"]
    assert spent["train"] > 0 and spent["build"] > 0 and spent["validation"] > 0 and spent["checkpoint"] > 0, spent
    assert spent["queued"] == spent["start"] == spent["restore"] == spent["replay"] == spent["other"] == 0.0, spent
    assert spent["wall"] == pytest.approx(sum(v for k, v in spent.items() if k != "wall"))
