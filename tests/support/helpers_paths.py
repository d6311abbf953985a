"""Where the tests' files are: the repository root and tests/support/ (trial fixtures, helpers, and the
worker scripts tests start by path), for tests in any folder and the processes they start."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO", "SUPPORT"]

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
