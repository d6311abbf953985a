"""The tiny Core API trial of ``trials_core_script`` (copied beside it as ``core_script.py``), leaving a file named
after its pid in ``$TRACKER_TEST_PIDS`` (when set) first, so that a test can kill -9 the trial process."""

from __future__ import annotations

import os
from pathlib import Path

import core_script  # type: ignore[import-not-found]

if __name__ == "__main__":
    if os.environ.get("TRACKER_TEST_PIDS"):
        (Path(os.environ["TRACKER_TEST_PIDS"]) / str(os.getpid())).touch()
    core_script.main()
