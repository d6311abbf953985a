"""The dashboard in a real browser (Debian's chromium driven by Playwright, headless) against experiments the
tests run: a `det-trials experiment create` runner (live progress, pause, continue, kill from the page), a
plain Core API script, and a store holding HTML in its names, values and logs (shown as text)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.helpers_paths import REPO, SUPPORT

pytest.importorskip("starlette", reason="the ui extra (starlette, uvicorn) is not installed")
pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from support.helpers_browser import Watched  # noqa: E402
from support.helpers_experiment import start_runner  # noqa: E402
from support.helpers_ui import EVIL, login_url, make_store, running_ui  # noqa: E402

from determined_trials.core import LocalStore  # noqa: E402
from determined_trials.core.store._owner import owner_alive  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TRIAL_SCRIPT = SUPPORT / "trials_ui_script.py"
DOCS = REPO / "docs"


def _cell(page: Any, trial_id: int, col: str) -> str:
    return str(page.text_content(f'#trials tbody tr[data-id="{trial_id}"] td[data-col="{col}"]') or "")


def _wait_state(page: Any, state: str, timeout_ms: int = 90_000) -> None:
    page.wait_for_selector(f'#summary [data-state="{state}"]', timeout=timeout_ms)


def _runner_context(tmp_path: Path) -> tuple[Path, Path]:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    shutil.copy(TRIAL_SCRIPT, ctx / "trial.py")
    config = {
        "name": "ui-live", "entrypoint": "python3 trial.py", "max_restarts": 0,
        "hyperparameters": {"lr": {"type": "categorical", "vals": [0.5, 2.0]}, "sleep": 0.1, "note": "hello"},
        "searcher": {"name": "grid", "metric": "validation_loss", "max_length": 2000},
        "reproducibility": {"experiment_seed": 3},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, ctx


def _end_owner(run_dir: Path) -> None:
    """Stop whatever process still runs experiment 1 (a continued runner is in a session of its own)."""
    store = LocalStore(run_dir)
    owner = store.experiment_owner(1)
    if owner is not None and owner_alive(*owner):
        os.killpg(owner[0], signal.SIGKILL)
    store.close()


def test_a_running_experiment_live_pause_continue_kill(tmp_path: Path, watched: Watched) -> None:
    config, ctx = _runner_context(tmp_path)
    run_dir = tmp_path / "runs"
    runner = start_runner(run_dir, config, ctx, tmp_path / "runner.out")
    page = watched.page
    try:
        with running_ui(run_dir) as (base, token):
            page.goto(login_url(base, token, "/"))
            page.wait_for_selector('#experiments tbody tr[data-id="1"] td[data-col="name"]:has-text("ui-live")')
            assert "ACTIVE" in str(page.text_content('#experiments tbody tr[data-id="1"]'))
            assert LocalStore(run_dir).experiment_owner(1) is not None

            page.goto(base + "/experiments/1")
            page.wait_for_selector('#trials tbody tr[data-id="1"]')
            headers = page.eval_on_selector_all("#trials thead th", "ths => ths.map(t => t.textContent)")
            assert {"Trial", "State", "lr", "note", "sleep", "Batches", "Best validation_loss", "Restarts"} <= set(headers)
            assert _cell(page, 1, "hp:lr") == "0.5" and _cell(page, 1, "hp:note") == "hello"
            page.wait_for_selector('#curves polyline[data-series="1"]')
            page.wait_for_selector("#hp-scatter svg")
            assert page.query_selector("#not-running") is None  # the runner's process is alive

            # live: batches, progress and the curve move without a reload, within ~2 s each
            page.evaluate("window.__noReload = 1")
            before = int(_cell(page, 1, "batches"))
            progress = page.text_content("#exp-progress")
            points = page.get_attribute('#curves polyline[data-series="1"]', "points")
            started = time.monotonic()
            page.wait_for_function(f'Number(document.querySelector(\'#trials tr[data-id="1"] td[data-col="batches"]\')'
                                   f'.textContent) > {before}', timeout=6_000)
            moved_after = time.monotonic() - started
            page.wait_for_function(f"document.querySelector('#exp-progress').textContent !== {progress!r}",
                                   timeout=10_000)
            page.wait_for_function("p => document.querySelector('#curves polyline[data-series=\"1\"]')"
                                   ".getAttribute('points') !== p", arg=points, timeout=10_000)
            assert page.evaluate("window.__noReload") == 1
            print(f"\nthe batches column moved {moved_after:.2f} s after the first look")
            assert moved_after < 4.0, f"the batches column took {moved_after:.1f} s to move"

            # pause from the page: the runner checkpoints and exits as paused (75)
            page.click("#pause")
            _wait_state(page, "PAUSED")
            page.wait_for_function("!document.querySelector('#action-msg').textContent.includes('ACTIVE')",
                                   timeout=5_000)  # the answer "pause: experiment is ACTIVE" went with that state
            assert runner.wait(timeout=60) == 75
            assert LocalStore(run_dir).experiment(1).state == "PAUSED"
            paused_at = int(_cell(page, 1, "batches"))

            # continue from the page: a new runner resumes trial 1 from its checkpoint
            page.wait_for_selector("#activate:not([disabled])")
            page.click("#activate")
            _wait_state(page, "ACTIVE")
            page.wait_for_function(f'Number(document.querySelector(\'#trials tr[data-id="1"] td[data-col="batches"]\')'
                                   f'.textContent) > {paused_at}', timeout=30_000)

            # the trial page: charts, checkpoints, a live log, the config
            page.goto(base + "/trials/1")
            page.wait_for_selector("#chart-training polyline")
            page.wait_for_selector("#chart-validation polyline")
            page.wait_for_selector("#checkpoints tbody tr")
            uuids = {c.uuid for c in LocalStore(run_dir).checkpoints(trial_id=1)}
            shown = set(page.eval_on_selector_all("#checkpoints tbody tr", "rows => rows.map(r => r.dataset.uuid)"))
            assert shown and shown <= uuids
            assert "lr" in str(page.text_content("#trial-info")) and "validation_loss" in str(page.text_content("#config"))
            page.wait_for_function("document.querySelector('#logs').textContent.includes('resumed at step')")
            log = page.text_content("#logs")
            page.evaluate("window.__noReload = 2")
            page.wait_for_function("l => document.querySelector('#logs').textContent !== l", arg=log, timeout=6_000)
            assert page.evaluate("window.__noReload") == 2

            # kill from the page (the confirmation is accepted)
            page.goto(base + "/experiments/1")
            page.wait_for_selector("#kill:not([disabled])")
            page.click("#kill")
            _wait_state(page, "CANCELED")
            store = LocalStore(run_dir)
            assert store.experiment(1).state == "CANCELED"
            assert {t.state for t in store.trials(1)} == {"CANCELED"}
            owner = store.experiment_owner(1)
            assert owner is None or not owner_alive(*owner)
            watched.assert_same_origin(base)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(timeout=30)
        _end_owner(run_dir)


CORE_SCRIPT = """
import determined_trials as det
config = {{"name": "core-script", "hyperparameters": {{"width": 4, "act": "relu"}},
          "searcher": {{"name": "single", "metric": "acc", "smaller_is_better": False, "max_length": 20}}}}
with det.core.init(run_dir={run_dir!r}, config=config) as ctx:
    for step in range(1, 21):
        ctx.train.report_training_metrics(steps_completed=step, metrics={{"loss": 1.0 / step}})
    ctx.train.report_validation_metrics(steps_completed=20, metrics={{"acc": 0.9}})
    with ctx.checkpoint.store_path({{"steps_completed": 20}}) as (path, uuid):
        (path / "weights.bin").write_bytes(b"x" * 4096)
"""


def test_a_plain_core_api_script(tmp_path: Path, watched: Watched) -> None:
    run_dir = tmp_path / "runs"
    subprocess.run([sys.executable, "-c", textwrap.dedent(CORE_SCRIPT.format(run_dir=str(run_dir)))], check=True,
                   timeout=120)
    page = watched.page
    with running_ui(run_dir) as (base, token):
        page.goto(login_url(base, token, "/"))
        page.wait_for_selector('#experiments tbody tr[data-id="1"]')
        page.goto(base + "/experiments/1")
        page.wait_for_selector('#trials tbody tr[data-id="1"]')
        assert _cell(page, 1, "hp:width") == "4" and _cell(page, 1, "hp:act") == "relu"
        assert _cell(page, 1, "batches") == "20"
        page.wait_for_selector("#pause[disabled]")
        page.wait_for_selector("#activate[disabled]")
        page.wait_for_selector("#curves polyline", state="attached")
        page.goto(base + "/trials/1")
        page.wait_for_selector("#checkpoints tbody tr")
        assert "4.0 KiB" in str(page.text_content("#checkpoints"))
        page.wait_for_selector("#chart-training polyline")
        page.wait_for_function("document.querySelector('#logs').textContent.includes('No log')")
        watched.assert_same_origin(base)
    with running_ui(run_dir, "--read-only") as (base, token):
        page.goto(login_url(base, token, "/experiments/1"))
        page.wait_for_selector("#no-actions:has-text('read-only')")
        assert page.query_selector("#kill") is None


def test_html_in_names_values_and_logs_is_shown_as_text(tmp_path: Path, watched: Watched) -> None:
    run_dir = tmp_path / "runs"
    store = LocalStore(run_dir)
    exp = store.create_experiment(name=EVIL, config={"name": EVIL, "searcher": {"metric": EVIL}})
    tid = store.create_trial(experiment_id=exp, hparams={EVIL: EVIL, "x": 1}, seed=0)
    store.add_metrics(trial_id=tid, group="validation", steps_completed=1, metrics={EVIL: 1.0})
    store.add_metrics(trial_id=tid, group="training", steps_completed=1, metrics={EVIL: 2.0})
    store.add_checkpoint(uuid=EVIL, trial_id=tid, steps_completed=1, metadata={}, resources={"a": 1}, storage=EVIL)
    log = run_dir / "experiments" / str(exp) / f"trial_{tid}.log"
    log.parent.mkdir(parents=True)
    log.write_text(f"{EVIL}\n<script>window.__pwned=2</script>\n")
    page = watched.page
    with running_ui(run_dir) as (base, token):
        for path, ready in (("/", "#experiments tbody tr"), ("/experiments/1", "#trials tbody tr"),
                            ("/trials/1", "#checkpoints tbody tr")):
            page.goto(login_url(base, token, path))
            page.wait_for_selector(ready)
            page.wait_for_timeout(500)
            assert page.evaluate("window.__pwned") is None
            assert page.eval_on_selector_all("main img, main script", "n => n.length") == 0
            assert EVIL in str(page.text_content("main"))
        page.wait_for_function("document.querySelector('#logs').textContent.includes('<script>window.__pwned=2')")
        assert page.evaluate("window.__pwned") is None
        watched.assert_same_origin(base)


def test_screenshots_of_the_three_pages(tmp_path: Path, watched: Watched) -> None:
    """Writes docs/ui-*.png when DET_UI_SCREENSHOTS=docs (`make ui-screenshots`), else into the test's folder."""
    out = DOCS if os.environ.get("DET_UI_SCREENSHOTS") == "docs" else tmp_path
    run_dir = tmp_path / "runs"
    store = make_store(run_dir, trials=8, training_rows=400, validation_rows=40, name="digits grid search")
    store.set_experiment_model_dir(1, str(run_dir / "experiments" / "1" / "model"))  # as the runner's: buttons on
    make_store(run_dir, trials=3, training_rows=100, validation_rows=10, name="lr sweep")
    for trial in store.trials(2):
        store.set_trial_state(trial.id, "COMPLETED")
    store.set_experiment_state(2, "COMPLETED")
    store.close()
    log = run_dir / "experiments" / "1" / "trial_2.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"[rank=0] step {s}: loss={1.0 / s:.4f}\n" for s in range(1, 401)))
    page = watched.page
    with running_ui(run_dir) as (base, token):
        for path, ready, name in (("/", "#experiments tbody tr", "ui-experiments.png"),
                                  ("/experiments/1", "#hp-parallel svg", "ui-experiment.png"),
                                  ("/trials/2", "#chart-validation polyline", "ui-trial.png")):
            page.goto(login_url(base, token, path))
            page.wait_for_selector(ready)
            page.wait_for_timeout(300)
            page.screenshot(path=str(out / name), full_page=True)
            assert (out / name).stat().st_size > 10_000
        watched.assert_same_origin(base)


def test_sorting_the_trials_table_and_an_unknown_id(tmp_path: Path, watched: Watched) -> None:
    run_dir = tmp_path / "runs"
    store = make_store(run_dir, trials=5)
    store.add_metrics(trial_id=4, group="validation", steps_completed=60, metrics={"validation_loss": 0.01})
    store.close()
    page = watched.page
    order = "rows => rows.map(r => Number(r.dataset.id))"
    with running_ui(run_dir) as (base, token):
        page.goto(login_url(base, token, "/experiments/1"))
        page.wait_for_selector('#trials tbody tr[data-id="5"]')
        assert page.eval_on_selector_all("#trials tbody tr", order) == [1, 2, 3, 4, 5]
        page.click('#trials th[data-key="best"]')
        assert page.eval_on_selector_all("#trials tbody tr", order) == [4, 1, 2, 3, 5]
        page.click('#trials th[data-key="best"]')
        assert page.eval_on_selector_all("#trials tbody tr", order) == [5, 3, 2, 1, 4]
        page.click('#trials th[data-key="hp:opt"]')
        assert [page.text_content(f'#trials tr[data-id="{i}"] td[data-col="hp:opt"]') for i in
                page.eval_on_selector_all("#trials tbody tr", order)] == ["adam", "adam", "sgd", "sgd", "sgd"]
        page.wait_for_timeout(2_000)  # a refresh keeps the chosen order
        assert page.get_attribute('#trials th[data-key="hp:opt"]', "class") == "sortable sorted-asc"
        page.goto(base + "/trials/42")
        page.wait_for_selector("#not-found")
        assert "trial 42 not found" in str(page.text_content("#not-found"))
        assert page.query_selector("#kill") is None
        watched.assert_same_origin(base)


def test_the_trial_and_experiment_pages_show_where_the_time_went(tmp_path: Path, watched: Watched) -> None:
    run_dir = tmp_path / "runs"
    store = make_store(run_dir)
    store.add_trial_time(1, {"start": 2.0, "train": 6.0, "replay": 1.0, "wall": 12.0})
    store.add_trial_time(2, {"train": 2.0, "wall": 4.0})
    store.close()
    page = watched.page
    with running_ui(run_dir) as (base, token):
        page.goto(login_url(base, token, "/trials/1"))
        page.wait_for_selector('#trial-time tr[data-part="replay"]')
        assert page.text_content('#trial-time tr[data-part="replay"]') == "replay1.00 s8.3 %"
        assert page.text_content('#trial-time tr[data-part="other"]') == "other3.00 s25.0 %"
        assert page.query_selector('#trial-time tr[data-part="goodput"]') is None
        page.goto(base + "/experiments/1")
        page.wait_for_selector('#experiment-time tr[data-part="goodput"]')
        assert page.text_content('#experiment-time tr[data-part="wall"]') == "wall16.00 s100.0 %"
        assert page.text_content('#experiment-time tr[data-part="goodput"]') == "goodput50.0 %train / wall"
        watched.assert_same_origin(base)
