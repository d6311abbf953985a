"""The dashboard at scale: one experiment of 200 trials × 5,000 metric rows each (4,500 training, 500
validation), written with the store API. Every API call answers within 1 s, and a browser draws the
experiment page (200 trials in the table, 200 learning curves, the hyperparameter plots) within 3 s; on a
loaded machine both limits grow with its load (``load_factor``)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the ui extra (starlette, uvicorn) is not installed")

from support.helpers_browser import chromium  # noqa: E402
from support.helpers_load import load_factor  # noqa: E402
from support.helpers_ui import login_url, make_big_store, running_ui  # noqa: E402

from determined_trials.ui import UiSettings, create_app  # noqa: E402

with warnings.catch_warnings():  # starlette 1.x asks for httpx2 in place of httpx; both work
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TRIALS = 200
API_LIMIT_S, PAGE_LIMIT_S = 1.0, 3.0


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    run_dir = tmp_path_factory.mktemp("big") / "runs"
    make_big_store(run_dir)
    yield run_dir


CALLS = [
    "/api/v1/experiments", "/api/v1/experiments/1", "/api/v1/experiments/1/trials",
    "/api/v1/experiments/1/metrics?group=validation&metric=validation_loss&max_points=200",
    "/api/v1/experiments/1/metrics?group=training&metric=loss&max_points=200",
    "/api/v1/trials/100", "/api/v1/trials/100/metrics?group=training&max_points=500",
    "/api/v1/trials/100/metrics?group=validation&max_points=500", "/api/v1/trials/100/checkpoints",
    "/api/v1/trials/1/logs?tail=200", "/api/v1/trials/1/logs?tail=5000",
]


def test_every_api_call_answers_within_a_second(big_run: Path) -> None:
    token = "scale-test-token-0123456789"
    client = TestClient(create_app(UiSettings(run_dir=big_run, token=token)), base_url="http://127.0.0.1:8080",
                        headers={"Authorization": f"Bearer {token}"})
    timings = {}
    for path in CALLS:
        client.get(path)  # the first call warms SQLite's page cache, as a page's first poll does
        runs = []
        for _ in range(3):  # the best of three: the machine is shared, other work steals the cores at times
            start = time.perf_counter()
            response = client.get(path)
            runs.append(time.perf_counter() - start)
            assert response.status_code == 200, (path, response.text)
        timings[path] = (min(runs), max(runs))
    print("\n" + "\n".join(f"{lo * 1000:7.0f} ms (worst {hi * 1000:5.0f})  {p}" for p, (lo, hi) in timings.items()))
    limit = API_LIMIT_S * load_factor()  # 1 s on a machine whose cores are not taken by other work
    slow = {p: round(lo, 2) for p, (lo, _) in timings.items() if lo > limit}
    assert not slow, f"API calls slower than {limit:.2f} s: {slow}"
    curves = client.get(CALLS[3]).json()["trials"]
    assert len(curves) == TRIALS and all(len(c["steps"]) <= 200 for c in curves.values())


def test_the_experiment_page_is_drawn_within_three_seconds(big_run: Path) -> None:
    with chromium() as browser, running_ui(big_run) as (base, token):
        page = browser.new_page(viewport={"width": 1300, "height": 900}, bypass_csp=True)
        page.goto(login_url(base, token))  # the browser itself started and warm, as a user's is
        page.wait_for_selector("#experiments tbody tr")
        drawn = []
        for _ in range(2):  # the best of two, for the same reason as above
            start = time.perf_counter()
            page.goto(base + "/experiments/1")
            page.wait_for_function(f"document.querySelectorAll('#trials tbody tr').length === {TRIALS} && "
                                   f"document.querySelectorAll('#curves polyline').length === {TRIALS} && "
                                   "document.querySelector('#hp-parallel svg') !== null", timeout=30_000)
            drawn.append(time.perf_counter() - start)
            page.goto(base + "/")
        print(f"\nexperiment page with {TRIALS} trials drawn in {min(drawn):.2f} s (worst {max(drawn):.2f} s)")
        limit = PAGE_LIMIT_S * load_factor()  # 3 s on a machine whose cores are not taken by other work
        assert min(drawn) <= limit, f"the experiment page took {min(drawn):.2f} s (limit {limit:.2f} s)"
