"""``python -m determined_trials.core.trackers <trial pid>``: a trial's tracker helper process (``_helper_main``)."""

from __future__ import annotations

import sys

from determined_trials.core.trackers._helper_main import serve

if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
