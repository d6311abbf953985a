"""The browser tests' fixtures: ``browser`` (Debian's chromium through Playwright, one per module; skipped without
either) and ``watched`` (a fresh page in a 1300 × 900 viewport)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.helpers_browser import Watched, chromium, watched_page


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    with watched_page(browser) as seen:
        yield seen
