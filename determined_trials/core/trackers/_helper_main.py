"""The tracker helper process (``python -m determined_trials.core.trackers <trial pid>``): the tracker clients of one
trial, fed from the store by a ``TrackerForwarder``, off the training process; see ``_helper`` for the protocol."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from typing import IO, Any

from determined_trials._info import TrialInfo
from determined_trials.config import load_config
from determined_trials.core.channel import open_store
from determined_trials.core.trackers._helper import READY
from determined_trials.core.trackers._setup import open_forwarder
from determined_trials.core.trackers._sink import Outcome, TrialFacts

__all__ = ["serve"]

logger = logging.getLogger("determined_trials.trackers")

_PARENT_CHECK_S = 1.0
_FIRST_PASS_TIMEOUT_S = 60.0


def _facts(payload: dict[str, Any]) -> TrialFacts:
    facts = dict(payload)
    facts["trial"] = TrialInfo(**facts["trial"])
    return TrialFacts(**facts)


def _outcome_word(stdin: IO[str], parent_pid: int) -> Outcome:
    """The outcome the trial sends at its end; ``KILLED`` when its stdin closes without one or the trial is gone."""
    word: list[str] = []
    said = threading.Event()

    def read() -> None:
        word.append(stdin.readline().strip())
        said.set()

    threading.Thread(target=read, name="det-trackers-word", daemon=True).start()
    while not said.wait(_PARENT_CHECK_S):
        if os.getppid() != parent_pid:  # the trial died and something else adopted this process
            break
    if word and word[0] in Outcome.__members__:
        return Outcome[word[0]]
    logger.info("trackers: trial process %d ended without a word; sending what the store holds", parent_pid)
    return Outcome.KILLED


def serve(parent_pid: int) -> int:
    """Run the helper of the trial process ``parent_pid``: read its facts, build the clients, say ``ready``, forward
    until the trial's outcome (or its death), then send the rest and end each run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trial says when to stop (a terminal's Ctrl-C is the trial's)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a client's prints go with the trial's output, not to the pipe
    first = sys.stdin.readline()
    if not first:
        return 1
    payload = json.loads(first)
    facts, config = _facts(payload["facts"]), load_config(payload["config"])
    forwarder = open_forwarder(open_store(facts.run_dir), facts, config.integrations)
    if forwarder is not None:  # the runs exist before the first batch: its report is not held up by their creation
        forwarder.first_pass.wait(_FIRST_PASS_TIMEOUT_S)
    reply.write(READY + "\n")
    reply.close()
    outcome = _outcome_word(sys.stdin, parent_pid)
    if forwarder is not None:
        forwarder.finish(outcome)
    return 0
