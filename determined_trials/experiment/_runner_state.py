"""The runner's state: trials queued and running, stop requests and failures, and what it saves for `continue`."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

from determined_trials.core.storage import storage_from_spec
from determined_trials.core.store import LocalStore, RetentionPolicy, collect_garbage
from determined_trials.core.trackers import mark_deleted_checkpoints
from determined_trials.experiment._executor import LocalExecutor, TrialExecutor, TrialHandle
from determined_trials.experiment._fork import ForkStart
from determined_trials.experiment._report import Display
from determined_trials.experiment._tracebacks import TracebackCondenser
from determined_trials.experiment._warm_start import WarmStart
from determined_trials.searcher import Searcher

__all__ = ["RunnerState", "RunningTrial", "Work"]

_STATE_VERSION = 1


@dataclasses.dataclass
class Work:
    """A trial to start (or start again): the searcher's request and, once created, its trial id. A PBT
    child also carries its lineage: the checkpoint it starts from (``warm_start``, resolved when the
    searcher asked for it), the parent trial and the round it starts in."""

    request_id: int
    hparams: dict[str, Any]
    seed: int
    trial_id: int | None = None
    warm_start: str | None = None
    parent_trial_id: int | None = None
    search_round: int | None = None


@dataclasses.dataclass
class RunningTrial:
    """A trial process the runner started: its work, the length it trains to, the process, its GPUs."""

    work: Work
    length: int
    proc: TrialHandle
    gpus: list[str]


class RunnerState:
    """What an ``ExperimentRunner`` holds, saves at a pause and restores at ``continue``, and the small
    services all its parts use (messages, each trial's log echo, checkpoint garbage collection)."""

    def __init__(
        self, *, store: LocalStore, experiment_id: int, config: Any, searcher: Searcher, exp_dir: Path,
        model_dir: Path, config_path: Path, max_parallel: int = 1, display: Display | None = None,
        gpus: list[str] | None = None, requested_parallel: int | None = None,
        executor: TrialExecutor | None = None,
    ) -> None:
        """``gpus``: the GPU ids to share out, ``slots_per_trial`` to each running trial (none: CPU).
        ``requested_parallel``: the user's ``--max-parallel``, saved for ``experiment continue``;
        ``executor``: where trials run (default: processes on this machine)."""
        self.store = store
        self.experiment_id = experiment_id
        self._config = config
        self._config_dict = config.as_dict()
        self._searcher = searcher
        self._exp_dir = exp_dir
        self._model_dir = model_dir
        self._config_path = config_path
        self._max_parallel = max(1, int(max_parallel))
        self._requested_parallel = requested_parallel
        self._display = display or Display(progress=False)
        self._queue: list[Work] = []
        self._free_gpus = list(gpus or [])
        self._running: dict[int, RunningTrial] = {}
        self._trial_news = threading.Event()  # set by an executor when a trial may have ended
        self._echoes: dict[int, TracebackCondenser] = {}  # per trial, kept across its restarts
        self._ended_by_searcher: dict[int, tuple[Work, int]] = {}  # trial id -> (work, last length)
        self._stop_requests = 0
        self._stop_requests_seen = 0
        self._pausing = False
        self._killed = False
        self._canceled = False  # `det-trials experiment kill`: the experiment ends CANCELED
        self._failure: str | None = None
        self._last_failure: dict[int, str] = {}  # trial id -> how its latest attempt failed
        self._queued_since: dict[int, float] = {}  # request id -> when its work (re)entered the queue
        self._storage = storage_from_spec(config.checkpoint_storage, default_dir=store.path / "checkpoints")
        self._policy = RetentionPolicy.from_config(config)
        self._executor: TrialExecutor = executor or LocalExecutor()
        self._warm_start: WarmStart | None = None  # searcher.source_trial_id / source_checkpoint_uuid, resolved
        searcher.cap_in_flight(self._max_parallel)  # e.g. optuna's: never more trials asked than run at once

    # -- set-up and saved state -----------------------------------------------------------------
    def start_fresh(self, warm_start: WarmStart | None = None, fork: ForkStart | None = None) -> None:
        """Queue the searcher's initial trials (``warm_start``: the checkpoint each starts from, weights only;
        ``fork``: the one trial continues that checkpoint, with its parent's seed, as a PBT child does)."""
        self._warm_start = warm_start
        self._queue = [Work(r.request_id, dict(r.hparams), int(r.seed), search_round=r.search_round)
                       for r in self._searcher.initial_trials()]
        if fork is not None:
            first = self._queue[0]
            first.seed, first.warm_start, first.parent_trial_id = fork.seed, fork.checkpoint, fork.parent_trial_id

    def state_dict(self) -> dict[str, Any]:
        """The runner's and the searcher's resumable state (JSON-able)."""
        return {
            "version": _STATE_VERSION,
            "searcher": self._searcher.state_dict(),
            "queue": [dataclasses.asdict(r.work) for r in self._running.values()]
            + [dataclasses.asdict(w) for w in self._queue],  # running first: resumed first after a kill
            "ended_by_searcher": [[dataclasses.asdict(w), n] for w, n in self._ended_by_searcher.values()],
            "max_parallel": self._requested_parallel,
            "warm_start": None if self._warm_start is None else dataclasses.asdict(self._warm_start),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved (at a pause)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"saved runner state has version {state.get('version')!r}, expected {_STATE_VERSION}")
        self._searcher.load_state_dict(state["searcher"])
        self._warm_start = WarmStart(**state["warm_start"]) if state.get("warm_start") else None
        self._queue = [Work(**w) for w in state["queue"]]
        self._ended_by_searcher = {}
        for raw, length in state.get("ended_by_searcher", []):
            work = Work(**raw)
            assert work.trial_id is not None
            self._ended_by_searcher[work.trial_id] = (work, int(length))
        self._adopt_unsaved_trials()

    def _adopt_unsaved_trials(self) -> None:
        """A runner killed between creating a trial in the store and saving its state left that trial out of
        its queue: the queued request with the trial's seed (one per request) takes it, so it does not run twice."""
        known = {w.trial_id for w in self._queue} | set(self._ended_by_searcher)
        unsaved = [t for t in self.store.trials(self.experiment_id) if t.id not in known]
        for work in self._queue:
            found = next((t for t in unsaved if work.trial_id is None and t.seed == work.seed), None)
            if found is not None:
                work.trial_id = found.id
                unsaved.remove(found)

    def _save_state(self) -> None:
        """Keep the resumable state current, so that `continue` works after a kill -9 of the runner."""
        self.store.set_searcher_state(self.experiment_id, self.state_dict())

    # -- where the trials' time goes: the runner's parts (queued, the wall of each attempt) --------
    def _stamp_queued(self) -> None:
        """Work that entered the queue since the last look is queued from now (a trial paused in between is not)."""
        now = time.time()
        for work in self._queue:
            self._queued_since.setdefault(work.request_id, now)

    def _attempt_starts(self, work: Work, trial_id: int) -> None:
        """The trial's process starts now: its wait for a slot is ``queued``, its attempt is open from then."""
        now = time.time()
        since = min(now, self._queued_since.pop(work.request_id, now))
        self.store.add_trial_time(trial_id, {"queued": now - since})
        self.store.set_trial_attempt(trial_id, since)

    def _unqueue_all(self) -> None:
        """The runner ends with work still queued: that wait was the trials' ``queued`` time (and wall)."""
        now = time.time()
        for work in self._queue:
            since = self._queued_since.pop(work.request_id, None)
            if work.trial_id is not None and since is not None:
                self.store.add_trial_time(work.trial_id, {"queued": now - since, "wall": now - since})

    # -- services ---------------------------------------------------------------------------------
    def _echo_for(self, trial_id: int) -> TracebackCondenser:
        if trial_id not in self._echoes:
            self._echoes[trial_id] = TracebackCondenser.for_trial(
                self._display.echo, exp_dir=self._exp_dir, model_dir=self._model_dir, trial_id=trial_id)
        return self._echoes[trial_id]

    def _collect(self, trial_ids: list[int]) -> None:
        starts = {w.warm_start for w in self._queue + [r.work for r in self._running.values()] if w.warm_start}
        collect_garbage(self.store, self._storage, self.experiment_id, trial_ids, self._policy, protect=starts)
        mark_deleted_checkpoints(self.store, self._config, trial_ids)  # their runs ended before this deletion

    def _say(self, message: str) -> None:
        self._display.echo(f"det-trials: {message}")
