"""The dashboard's browser tests' set-up: Debian's chromium driven by Playwright (headless) and a page that
records every URL it requested and every script error (the fixtures are in tests/ui/conftest.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Watched", "chromium", "chromium_path", "launched_chromium", "watched_page"]


def chromium_path() -> str | None:
    """Debian's chromium (`make browser` installs it); Playwright's own browser download is never used."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextmanager
def launched_chromium(sync_api: Any, path: str) -> Iterator[Any]:
    """Chromium at ``path``, headless, through Playwright's ``sync_api``; closed afterwards."""
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, headless=True,
                                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield launched
        finally:
            launched.close()


@contextmanager
def chromium() -> Iterator[Any]:
    """Debian's chromium under Playwright, closed afterwards; the test is skipped when playwright or chromium
    is missing."""
    import pytest

    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    path = chromium_path()
    if path is None:
        pytest.skip("chromium is not installed and `make browser` could not install it (apt-get install chromium)")
    with launched_chromium(sync_api, path) as browser:
        yield browser


@dataclass
class Watched:
    """A page and what it did: every URL it requested and every script error."""

    page: Any
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def assert_same_origin(self, base: str) -> None:
        outside = [u for u in self.requests if not (u == base or u.startswith(base + "/") or u.startswith("data:"))]
        assert not outside, f"requests left the page's origin {base}: {outside}"
        assert not self.errors, self.errors


@contextmanager
def watched_page(browser: Any, width: int = 1300, height: int = 900) -> Iterator[Watched]:
    """A new page of ``browser`` in a ``width`` × ``height`` viewport whose confirmations are accepted."""
    # bypass_csp: Playwright's waits evaluate strings, which the page's CSP forbids; the page must keep its data
    # as text and its requests at home without that safety net (test_ui_api checks the CSP header itself)
    context = browser.new_context(viewport={"width": width, "height": height}, bypass_csp=True)
    page = context.new_page()
    page.set_default_timeout(30_000)
    seen = Watched(page)
    page.on("request", lambda r: seen.requests.append(r.url))
    page.on("pageerror", lambda e: seen.errors.append(str(e)))
    page.on("dialog", lambda d: d.accept())
    try:
        yield seen
    finally:
        context.close()
