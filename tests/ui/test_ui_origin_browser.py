"""The dashboard's links back to where work came from, in a real browser (Debian's chromium through Playwright,
headless): a fork's trial and experiment page link to the parent trial and its experiment; a warm-started optuna
search's experiment page links to the earlier experiments its study was told."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the ui extra (starlette, uvicorn) is not installed")
pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from support.helpers_browser import Watched  # noqa: E402
from support.helpers_ui import add_origins, login_url, make_store, running_ui  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _links(page: Any, selector: str) -> list[tuple[str, str]]:
    found = page.eval_on_selector_all(f"{selector} a", "as => as.map(a => [a.textContent, a.getAttribute('href')])")
    return [tuple(pair) for pair in found]


def test_a_fork_and_a_warm_started_search_link_back_to_their_origin(tmp_path: Path, watched: Watched) -> None:
    run_dir = tmp_path / "runs"
    store = make_store(run_dir)
    fork, child, study = add_origins(store)
    store.close()
    page = watched.page
    with running_ui(run_dir) as (base, token):
        page.goto(login_url(base, token, f"/trials/{child}"))
        page.wait_for_selector('[data-field="Started from"] .origin')
        assert _links(page, '[data-field="Started from"]') == [("trial 2", "/trials/2"), ("experiment 1", "/experiments/1")]
        assert "forked from trial 2 (experiment 1), from checkpoint ckpt-2-00000000" in str(
            page.text_content('[data-field="Started from"]'))
        page.goto(f"{base}/experiments/{fork}")
        page.wait_for_selector("#origins .origin")
        assert _links(page, "#origins") == [("trial 2", "/trials/2"), ("experiment 1", "/experiments/1")]
        page.goto(f"{base}/experiments/{study}")
        page.wait_for_selector("#origins .origin")
        assert _links(page, "#origins") == [("experiment 1", "/experiments/1"), (f"experiment {fork}", f"/experiments/{fork}")]
        assert "optuna study told the trials of experiment 1, experiment 2" in str(page.text_content("#origins"))
        watched.assert_same_origin(base)
