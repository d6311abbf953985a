"""``TrackerForwarder``: a daemon thread (in the trial's tracker helper process, or the runner's) that sends a trial's
metric rows and checkpoints from the store to its tracker runs as they are stored, records how far each run has got,
and retries while a tracker is away.

Nothing here runs in the training process: the loop only writes to the store, as without trackers. Each row goes
out within about a second of being stored; the steps a restart reports again are not sent twice (``_progress``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from determined_trials.core.store import CheckpointState, MetricRecord, TrialStore
from determined_trials.core.trackers._progress import Progress, plan
from determined_trials.core.trackers._sink import Outcome, Sink

__all__ = ["FINISH_TIMEOUT_ENV", "Outcome", "TrackerForwarder"]

logger = logging.getLogger("determined_trials.trackers")

FINISH_TIMEOUT_ENV = "DET_TRACKER_FINISH_TIMEOUT"
_POLL_S = 1.0  # how often new rows are looked for
_MAX_BACKOFF_S = 30.0
_BATCH_ROWS = 500


class _Run:
    """One sink's progress: its run id once attached, what it holds of the trial's rows, the checkpoints it has
    recorded (all three kept in the store, so a later process of the trial starts where this one stopped)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.run_id: str | None = None
        self.progress = Progress()
        self.checkpoints: set[str] = set()
        self.closed = False
        self.failures = 0
        self.retry_at = 0.0
        self.warned = False


class TrackerForwarder:
    """Forwards trial ``trial_id``'s rows to each sink (looking every ``poll_s``, after calling ``before_pass``,
    e.g. to store reports the trial holds); ``start`` it, then ``finish`` it with the trial's outcome (a last pass,
    then each run's status)."""

    def __init__(self, store: TrialStore, trial_id: int, sinks: Sequence[Sink], *, poll_s: float = _POLL_S,
                 before_pass: Callable[[], None] | None = None, restart_step: int | None = None) -> None:
        self._store = store
        self._restart_step = restart_step  # the first step the trial's process trains (None: not the trial's)
        self._before_pass = before_pass
        self._trial_id = trial_id
        self._runs = [_Run(sink) for sink in sinks]
        self._poll_s = poll_s
        self._wake = threading.Event()
        self._outcome: Outcome | None = None
        self._deadline = float("inf")
        self._thread = threading.Thread(target=self._loop, name=f"det-trackers-{trial_id}", daemon=True)
        self.first_pass = threading.Event()
        """Set once the first look at the store is over (the runs attached, or the tracker found away)."""

    def start(self) -> TrackerForwarder:
        self._thread.start()
        return self

    def finish(self, outcome: Outcome, timeout_s: float | None = None) -> None:
        """Send what is left, end each run with its status ``outcome`` stands for; wait at most ``timeout_s``."""
        if timeout_s is None:
            timeout_s = float(os.environ.get(FINISH_TIMEOUT_ENV, "30"))
        self._deadline = time.monotonic() + timeout_s
        self._outcome = outcome
        self._wake.set()
        self._thread.join(timeout_s + 5.0)
        if self._thread.is_alive():
            logger.warning("trackers: trial %d's last metrics did not reach %s in %.0f s; they stay in the store "
                           "and the trial's next attempt sends them", self._trial_id,
                           ", ".join(r.sink.name for r in self._runs if not r.closed), timeout_s)

    # -- the thread ---------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            outcome = self._outcome  # read before the pass: a pass after finish() sees every row
            now = time.monotonic()
            if outcome is not None and now >= self._deadline:
                return
            self._store_held_reports(outcome)
            for run in self._runs:
                if not run.closed and now >= run.retry_at:
                    self._step(run, outcome)
            self.first_pass.set()
            if all(run.closed for run in self._runs):
                return
            if outcome is not None:  # finishing: retry every second until the deadline
                for run in self._runs:
                    run.retry_at = min(run.retry_at, now + 1.0)
            waits = [run.retry_at - now for run in self._runs if not run.closed and run.retry_at > now]
            wait = min(waits, default=0.0) if outcome is not None else min([*waits, self._poll_s])
            self._wake.wait(max(wait, 0.0))
            self._wake.clear()

    def _store_held_reports(self, outcome: Outcome | None) -> None:
        if self._before_pass is None or outcome is not None:  # finishing: the trial stored its last reports
            return
        try:
            self._before_pass()
        except Exception as exc:  # the trial's own store call reports the problem; keep forwarding
            logger.debug("trackers: storing the held reports failed: %s", exc)

    def _step(self, run: _Run, outcome: Outcome | None) -> None:
        try:
            self._attach(run)
            self._send_rows(run)
            self._send_checkpoints(run)
            if outcome is not None:
                run.sink.close(outcome)
                run.closed = True
        except Exception as exc:  # the tracker is away or refused: keep training, try again later
            run.failures += 1
            run.retry_at = time.monotonic() + min(_MAX_BACKOFF_S, 0.5 * 2 ** min(run.failures, 6))
            if not run.warned:
                run.warned = True
                logger.warning("trackers: %s did not take trial %d's metrics (%s: %s); training goes on, the metrics "
                               "stay in the store and are sent when it answers", run.sink.name, self._trial_id,
                               type(exc).__name__, exc)
            else:
                logger.debug("trackers: %s still failing: %s", run.sink.name, exc)
        else:
            if run.failures and run.warned:
                logger.warning("trackers: %s answers again; trial %d's metrics caught up", run.sink.name,
                               self._trial_id)
            run.failures = 0
            run.warned = False

    def _attach(self, run: _Run) -> None:
        if run.run_id is not None:
            return
        known = self._store.tracker_run(self._trial_id, run.sink.name)
        if known is None:  # the first attempt of the trial: the run id is kept before anything is logged
            self._store.set_tracker_run(self._trial_id, run.sink.name, run.sink.create())
            known = self._store.tracker_run(self._trial_id, run.sink.name)
            assert known is not None
        progress = Progress.from_record(known["forwarded_id"], known["progress"])
        from_step = progress.next_step
        if run.sink.rewinds and self._restart_step is not None:  # the lost attempt's points after its checkpoint go
            from_step = min(from_step, self._restart_step)
            rewound = progress.rewound(from_step)
            if rewound != progress:  # kept before the run drops anything
                self._store.set_tracker_forwarded(self._trial_id, run.sink.name, rewound.forwarded, rewound.as_json())
            progress = rewound
        url = run.sink.resume(known["run_id"], from_step)
        if url != known["url"]:
            self._store.set_tracker_run(self._trial_id, run.sink.name, known["run_id"], url)
        run.run_id = known["run_id"]
        run.progress = progress
        run.checkpoints = set(known["checkpoints"])

    def _send_rows(self, run: _Run) -> None:
        while True:
            rows = self._store.metrics_after(self._trial_id, run.progress.forwarded, limit=_BATCH_ROWS)
            if not rows:
                return
            send, progress = plan(run.progress, rows, self._earlier)
            if send:
                run.sink.log(send)
            self._store.set_tracker_forwarded(self._trial_id, run.sink.name, progress.forwarded, progress.as_json())
            if progress.held.keys() - run.progress.held.keys():
                logger.warning("trackers: trial %d reported other values for %s after its restart than %s was sent "
                               "before it; the run keeps the first values, the store has the new ones "
                               "(`det-trials trial describe %d` counts them)", self._trial_id,
                               ", ".join(sorted(progress.held.keys() - run.progress.held.keys())), run.sink.name,
                               self._trial_id)
            run.progress = progress
            if len(rows) < _BATCH_ROWS:
                return

    def _earlier(self, row: MetricRecord) -> list[MetricRecord]:
        return self._store.metrics_at(self._trial_id, row.group, row.steps_completed, row.id)

    def _send_checkpoints(self, run: _Run) -> None:
        """Record each new checkpoint; mark those that retention deleted (kept as ``deleted:<uuid>`` beside the
        uuids the sink has, so each is marked once), also one deleted before a pass saw it (its files are gone:
        only the mark)."""
        for checkpoint in self._store.checkpoints(trial_id=self._trial_id, include_deleted=True):
            deleted = checkpoint.state == CheckpointState.DELETED
            if not deleted and checkpoint.uuid not in run.checkpoints:
                run.sink.record_checkpoint(checkpoint)
                self._store.add_tracker_checkpoint(self._trial_id, run.sink.name, checkpoint.uuid)
                run.checkpoints.add(checkpoint.uuid)
            elif deleted and f"deleted:{checkpoint.uuid}" not in run.checkpoints:
                run.sink.record_deleted(checkpoint)
                self._store.add_tracker_checkpoint(self._trial_id, run.sink.name, f"deleted:{checkpoint.uuid}")
                run.checkpoints.add(f"deleted:{checkpoint.uuid}")
