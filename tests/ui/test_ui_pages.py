"""The dashboard's pages in a real browser (chromium through Playwright) at a laptop's 1280 px: nothing wider
than the window, "not found" for an unknown id, charts without the x-axis units, constants or clipped dots,
log axes for log-scaled hyperparameters, and words a user of the page understands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the ui extra (starlette, uvicorn) is not installed")
pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from support.helpers_browser import Watched, watched_page  # noqa: E402
from support.helpers_ui import login_url, running_ui  # noqa: E402

from determined_trials.core import LocalStore  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WIDTH = 1280
LONG_REASON = ("trial process failed (exit code 1): RuntimeError: CUDA out of memory. Tried to allocate "
               + "x" * 300 + "/" + "/".join(["a-very-long-folder-name"] * 20) + "/trial_1.log")


def _wide_store(run_dir: Path) -> None:
    """A runner's experiment with a long name, many long hyperparameters and a failed trial with a long reason."""
    store = LocalStore(run_dir)
    hparams = {f"a_rather_long_hyperparameter_name_{k}": f"value-{k}-" + "v" * 40 for k in range(14)}
    exp = store.create_experiment(name="an experiment with a long name " + "n" * 120,
                                  config={"searcher": {"name": "grid", "metric": "validation_loss"}})
    for i in range(3):
        tid = store.create_trial(experiment_id=exp, hparams={**hparams, "lr": 0.1 * (i + 1)}, seed=i)
        store.add_metrics(trial_id=tid, group="validation", steps_completed=10, metrics={"validation_loss": 1.0 + i})
    store.set_trial_state(1, "ERROR", LONG_REASON)
    store.set_experiment_state(exp, "ERROR", "trial 1 failed and max_restarts (0) is used up: " + LONG_REASON)
    store.close()


@contextmanager
def _opened(browser: Any, run_dir: Path, path: str, ready: str) -> Iterator[tuple[Watched, str]]:
    """`det-trials ui` over ``run_dir`` and a 1280 px wide page at ``path``, once ``ready`` is there: (page, base)."""
    with running_ui(run_dir) as (base, token), watched_page(browser, WIDTH) as seen:
        seen.page.goto(login_url(base, token, path))
        seen.page.wait_for_selector(ready)
        yield seen, base
        seen.assert_same_origin(base)


def _no_wider_than_the_window(page: Any) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= WIDTH, f"{page.url}: the page is {width} px wide in a {WIDTH} px window"


def test_every_page_fits_1280_px_and_long_reasons_wrap(tmp_path: Path, browser: Any) -> None:
    run_dir = tmp_path / "runs"
    _wide_store(run_dir)
    with _opened(browser, run_dir, "/", "#experiments tbody tr") as (seen, base):
        page = seen.page
        for path, ready in (("/", "#experiments tbody tr"), ("/experiments/1", '#trials tbody tr[data-id="3"]'),
                            ("/trials/1", "#trial-reason")):
            page.goto(base + path)
            page.wait_for_selector(ready)
            page.wait_for_timeout(300)
            _no_wider_than_the_window(page)
        assert page.evaluate("document.querySelector('#trial-reason').getBoundingClientRect().height") > 40  # wraps
        assert LONG_REASON in str(page.text_content("#trial-reason"))


def test_an_unknown_experiment_or_trial_says_not_found(tmp_path: Path, browser: Any) -> None:
    run_dir = tmp_path / "runs"
    _wide_store(run_dir)
    with _opened(browser, run_dir, "/", "#experiments tbody tr") as (seen, base):
        page = seen.page
        for path, said in (("/experiments/999", "experiment 999 not found"),
                           ("/experiments/99999999999999999999999", "not found"),
                           ("/trials/999", "trial 999 not found")):
            page.goto(base + path)
            page.wait_for_selector("#not-found")
            assert said in str(page.text_content("#not-found"))
            assert page.text_content("#title") == "Not found"
            assert page.query_selector("#actions") is None and page.query_selector("#kill") is None
            assert "e+" not in str(page.text_content("main")) + page.title()


def _chart_store(run_dir: Path) -> None:
    """A runner's experiment: lr of type log in the config, a constant and a categorical hyperparameter; its
    training metrics carry `batches` and `epochs` as the harness reports them."""
    store = LocalStore(run_dir)
    config = {"searcher": {"name": "random", "metric": "validation_loss"},
              "hyperparameters": {"lr": {"type": "log", "minval": -4, "maxval": -1}, "width": 64,
                                  "opt": {"type": "categorical", "vals": ["sgd", "adam"]}}}
    exp = store.create_experiment(name="charts", config=config)
    store.set_experiment_model_dir(exp, str(run_dir / "model"))
    for i in range(4):
        tid = store.create_trial(experiment_id=exp, hparams={"lr": 10.0 ** (-4 + i), "width": 64,
                                                             "opt": ["sgd", "adam"][i % 2]}, seed=i)
        for step in (5, 10):
            store.add_metrics(trial_id=tid, group="training", steps_completed=step,
                              metrics={"loss": 1.0 / step + i, "batches": step, "epochs": step // 5})
        store.add_metrics(trial_id=tid, group="validation", steps_completed=10, metrics={"validation_loss": 0.5 * i})
    store.close()


def test_charts_leave_out_x_units_and_constants_and_draw_log_axes(tmp_path: Path, browser: Any) -> None:
    run_dir = tmp_path / "runs"
    _chart_store(run_dir)
    with _opened(browser, run_dir, "/experiments/1", "#hp-parallel svg") as (seen, base):
        page = seen.page
        page.select_option("#curve-group", "training")
        options = page.eval_on_selector_all("#curve-metric option", "os => os.map(o => o.value)")
        assert options == ["loss"]
        titles = page.eval_on_selector_all("#hp-scatter .chart-title", "ts => ts.map(t => t.textContent)")
        assert titles == ["lr vs validation_loss", "opt vs validation_loss"]  # width is 64 in every trial
        axes = page.eval_on_selector_all("#hp-parallel [data-axis]", "ts => ts.map(t => [t.dataset.axis, t.dataset.log])")
        assert axes == [["lr", "1"], ["opt", "0"], ["validation_loss", "0"]]
        logs = page.eval_on_selector_all("#hp-scatter svg", "ss => ss.map(s => s.dataset.xLog)")
        assert logs == ["1", "0"]
        # on the log axis the four decades are evenly spaced; every dot lies whole inside the axes
        xs = page.eval_on_selector_all("#hp-scatter .chart:first-child circle", "cs => cs.map(c => Number(c.getAttribute('cx')))")
        gaps = [b - a for a, b in zip(sorted(xs), sorted(xs)[1:])]
        assert len(gaps) == 3 and max(gaps) - min(gaps) < 0.5, xs
        clipped = page.evaluate("""() => [...document.querySelectorAll('#hp-scatter svg')].flatMap(s => {
            const w = Number(s.getAttribute('width')), h = Number(s.getAttribute('height'));
            return [...s.querySelectorAll('circle')].filter(c => {
              const x = Number(c.getAttribute('cx')), y = Number(c.getAttribute('cy')), r = Number(c.getAttribute('r'));
              return x - r < 62 || x + r > w - 14 || y - r < 10 || y + r > h - 38; }).length ? [1] : []; })""")
        assert clipped == []
        page.goto(base + "/trials/1")
        page.wait_for_selector("#chart-training .chart")
        charts = page.eval_on_selector_all("#chart-training .chart-title", "ts => ts.map(t => t.textContent)")
        assert charts == ["loss"]


def test_words_plurals_and_why_a_script_run_has_no_pause(tmp_path: Path, browser: Any) -> None:
    run_dir = tmp_path / "runs"
    store = LocalStore(run_dir)
    script = store.create_experiment(name="script", config={"searcher": {"metric": "loss"}})  # no runner
    store.create_trial(experiment_id=script, hparams={"x": 1}, seed=0)
    runner = store.create_experiment(name="runner", config={"searcher": {"metric": "loss"}})
    store.set_experiment_model_dir(runner, str(run_dir / "model"))
    store.create_trial(experiment_id=runner, hparams={"x": 1}, seed=0)
    store.create_trial(experiment_id=runner, hparams={"x": 2}, seed=1)
    store.close()
    with _opened(browser, run_dir, "/experiments/1", "#trial-counts:has-text('1 trial:')") as (seen, base):
        page = seen.page
        assert "trials" not in str(page.text_content("#trial-counts"))
        page.wait_for_selector("#actions-note:has-text(\"a plain script's run can only be killed\")")
        for button in ("#pause", "#activate"):
            assert page.is_disabled(button)
            assert "plain script's run can only be killed" in str(page.get_attribute(button, "title"))
        assert page.is_enabled("#kill")

        # a runner's experiment: no note; a message about the action goes once the experiment's state changes
        page.goto(base + "/experiments/2")
        page.wait_for_selector("#trial-counts:has-text('2 trials:')")
        assert page.text_content("#actions-note") == ""
        page.click("#pause")  # no process runs it: the action fails, and says so
        page.wait_for_selector("#action-msg:has-text('pause failed')")
        LocalStore(run_dir).set_experiment_state(runner, "PAUSED")
        page.wait_for_selector('#summary [data-state="PAUSED"]')
        page.wait_for_function("document.querySelector('#action-msg').textContent === ''", timeout=5_000)
        assert page.is_enabled("#activate") and page.get_attribute("#activate", "title") is None
