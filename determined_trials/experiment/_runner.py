"""``ExperimentRunner``: the master's part on one machine. It creates the searcher's trials, runs their
processes (a few at once at most), feeds completed operations back to the searcher, restarts failed
trials from their latest checkpoint, and pauses everything on SIGINT/SIGTERM, resumably (or, when
`det-trials experiment kill` marked the experiment CANCELED first, stops its trials now and ends CANCELED)."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from determined_trials.core.storage import storage_from_spec
from determined_trials.core.store import RunState
from determined_trials.core.store._checkpoint_recovery import recover_checkpoints
from determined_trials.core.store._local import LocalStore
from determined_trials.core.store._owner import claim_experiment
from determined_trials.core.store._retention import RetentionPolicy, collect_garbage
from determined_trials.experiment._executor import LocalExecutor, TrialExecutor, TrialHandle, TrialJob
from determined_trials.experiment._launch import TrialLaunch
from determined_trials.experiment._report import Display
from determined_trials.experiment._reported import metric_from_validations, missing_metric_reason
from determined_trials.experiment._tracebacks import TracebackCondenser
from determined_trials.launch import PREEMPTED_EXIT_CODE

__all__ = ["KILLED_REASON", "ExperimentRunner", "Work"]

_POLL_S = 0.05
_STATE_VERSION = 1
KILLED_REASON = "killed with `det-trials experiment kill`"


@dataclasses.dataclass
class Work:
    """A trial to start (or start again): the searcher's request and, once created, its trial id."""

    request_id: int
    hparams: dict[str, Any]
    seed: int
    trial_id: int | None = None


@dataclasses.dataclass
class _Running:
    work: Work
    length: int
    proc: TrialHandle
    gpus: list[str]


class ExperimentRunner:
    """Runs one experiment of the store to its end, or until paused; see ``run()``."""

    def __init__(
        self, *, store: LocalStore, experiment_id: int, config: Any, searcher: Any, exp_dir: Path,
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
        self._running: dict[int, _Running] = {}
        self._echoes: dict[int, TracebackCondenser] = {}  # per trial, kept across its restarts
        self._ended_by_searcher: dict[int, tuple[Work, int]] = {}  # trial id -> (work, last length)
        self._stop_requests = 0
        self._stop_requests_seen = 0
        self._pausing = False
        self._killed = False
        self._canceled = False  # `det-trials experiment kill`: the experiment ends CANCELED
        self._failure: str | None = None
        self._last_failure: dict[int, str] = {}  # trial id -> how its latest attempt failed
        self._storage = storage_from_spec(config.checkpoint_storage, default_dir=store.path / "checkpoints")
        self._policy = RetentionPolicy.from_config(config)
        self._executor: TrialExecutor = executor or LocalExecutor()

    # -- set-up and saved state -----------------------------------------------------------------
    def start_fresh(self) -> None:
        """Queue the searcher's initial trials."""
        self._queue = [Work(r.request_id, dict(r.hparams), int(r.seed)) for r in self._searcher.initial_trials()]

    def state_dict(self) -> dict[str, Any]:
        """The runner's and the searcher's resumable state (JSON-able)."""
        return {
            "version": _STATE_VERSION,
            "searcher": self._searcher.state_dict(),
            "queue": [dataclasses.asdict(r.work) for r in self._running.values()]
            + [dataclasses.asdict(w) for w in self._queue],  # running first: resumed first after a kill
            "ended_by_searcher": [[dataclasses.asdict(w), n] for w, n in self._ended_by_searcher.values()],
            "max_parallel": self._requested_parallel,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved (at a pause)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"saved runner state has version {state.get('version')!r}, expected {_STATE_VERSION}")
        self._searcher.load_state_dict(state["searcher"])
        self._queue = [Work(**w) for w in state["queue"]]
        self._ended_by_searcher = {}
        for raw, length in state.get("ended_by_searcher", []):
            work = Work(**raw)
            assert work.trial_id is not None
            self._ended_by_searcher[work.trial_id] = (work, int(length))

    # -- the loop ---------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Pause (first call) or kill the running trials (second call); safe in a signal handler."""
        self._stop_requests += 1

    def run(self) -> str:
        """Run until every trial ended, the experiment failed, or a stop was requested; returns the
        experiment's state (COMPLETED, ERROR, PAUSED, or CANCELED after `det-trials experiment kill`)."""
        self.store.set_experiment_state(self.experiment_id, RunState.ACTIVE)
        claim_experiment(self.store, self.experiment_id)
        with _stop_signals(self.request_stop):
            try:
                self._executor.prepare(self._config, self._storage)
                self._loop()
            except BaseException as exc:
                self._kill_all()
                self._failure = self._failure or f"the experiment runner stopped: {type(exc).__name__}: {exc}"
                self._finish()
                raise
        return self._finish()

    def _loop(self) -> None:
        while True:
            self._apply_stop()
            stopping = self._pausing or self._failure is not None
            while not stopping and self._queue and len(self._running) < self._max_parallel:
                self._start(self._queue.pop(0))
            if not self._running and (stopping or not self._queue):
                return
            self._reap()
            self._display.update(self._searcher.progress())
            time.sleep(_POLL_S)

    def _apply_stop(self) -> None:
        if self._stop_requests > self._stop_requests_seen:  # a new signal: from `experiment kill`? (even mid-pause)
            self._stop_requests_seen = self._stop_requests
            if not self._canceled and self.store.experiment(self.experiment_id).state == RunState.CANCELED:
                self._canceled = self._pausing = True
                self._say("the experiment was killed (`det-trials experiment kill`): stopping its trials now")
                self._kill_all()
                return
        if self._stop_requests and not self._pausing:
            self._pausing = True
            if self._running:
                self._say(f"pausing: asking {len(self._running)} running trial(s) to checkpoint and stop "
                          "(Ctrl-C again to kill them)")
            for running in self._running.values():
                running.proc.terminate()
        if self._stop_requests >= 2 and not self._killed:
            self._say("stopping again: killing the running trials (they resume from their latest checkpoint)")
            self._kill_all()

    def _kill_all(self) -> None:
        self._killed = True
        for running in self._running.values():
            running.proc.kill()
        for running in self._running.values():
            with contextlib.suppress(Exception):
                running.proc.wait(timeout=30)

    def _reap(self) -> None:
        for trial_id, running in list(self._running.items()):
            code = running.proc.poll()
            if code is not None:
                del self._running[trial_id]
                self._free_gpus.extend(running.gpus)
                self._on_exit(running, code)
                self._save_state()

    def _save_state(self) -> None:
        """Keep the resumable state current, so that `continue` works after a kill -9 of the runner."""
        self.store.set_searcher_state(self.experiment_id, self.state_dict())

    # -- starting ---------------------------------------------------------------------------------
    def _start(self, work: Work) -> None:
        if work.trial_id is None:
            work.trial_id = self.store.create_trial(
                experiment_id=self.experiment_id, hparams=work.hparams, seed=work.seed
            )
        trial_id = work.trial_id
        length = self._searcher.next_length(work.request_id)
        if length is None:
            self.store.set_trial_state(trial_id, RunState.COMPLETED, "stopped by the searcher")
            self._collect([trial_id])
            return
        trial = self.store.trial(trial_id)
        recover_checkpoints(self.store, self._storage, trial_id)  # a checkpoint published before a kill counts
        latest = self.store.latest_checkpoint(trial_id)
        launch = TrialLaunch(
            experiment_id=self.experiment_id, trial_id=trial_id, hparams=work.hparams, seed=work.seed,
            config=self._config_dict, length=int(length), latest_checkpoint=latest.uuid if latest else None,
            steps_completed=latest.steps_completed if latest else 0, run_id=1 + trial.restarts,
        )
        trial_dir = self._exp_dir / f"trial_{trial_id}"
        gpus = self._take_gpus()
        self.store.set_trial_state(trial_id, RunState.ACTIVE)
        where = f" from checkpoint {latest.uuid} (step {latest.steps_completed})" if latest else ""
        self._say(f"trial {trial_id} starts{where}: training to length {length}")
        proc = self._executor.start(TrialJob(
            launch=launch, entrypoint=self._config.entrypoint, slots=self._config.resources.slots_per_trial,
            run_dir=self.store.path, trial_dir=trial_dir, model_dir=self._model_dir, config_path=self._config_path,
            log_path=self._exp_dir / f"trial_{trial_id}.log", echo=self._echo_for(trial_id), gpus=tuple(gpus),
        ))
        self._running[trial_id] = _Running(work, int(length), proc, gpus)
        self._save_state()
        if self._pausing:
            proc.terminate()

    def _take_gpus(self) -> list[str]:
        count = min(self._config.resources.slots_per_trial, len(self._free_gpus))
        taken, self._free_gpus = self._free_gpus[:count], self._free_gpus[count:]
        return taken

    def _echo_for(self, trial_id: int) -> TracebackCondenser:
        if trial_id not in self._echoes:
            self._echoes[trial_id] = TracebackCondenser.for_trial(
                self._display.echo, exp_dir=self._exp_dir, model_dir=self._model_dir, trial_id=trial_id)
        return self._echoes[trial_id]

    # -- outcomes ---------------------------------------------------------------------------------
    def _on_exit(self, running: _Running, code: int) -> None:
        self._echo_for(_trial_id(running.work)).flush()
        trial = self.store.trial(_trial_id(running.work))
        if self._canceled:
            self.store.set_trial_state(trial.id, RunState.CANCELED, "experiment killed")
            self._collect([trial.id])
        elif code == 0 and trial.state != RunState.PAUSED:
            self._on_done(running)
        elif code == PREEMPTED_EXIT_CODE or trial.state == RunState.PAUSED or running.proc.terminated:
            self._on_preempted(running)
        else:
            self._on_failed(running, code)

    def _on_done(self, running: _Running) -> None:
        work, trial_id = running.work, _trial_id(running.work)
        early = self.store.trial(trial_id).early_exit_reason
        metric = None if early else self._op_metric(trial_id, running.length)
        if metric is None and not early:  # no operation completed: a 0.38 script reports validations only
            metric = metric_from_validations(self.store, trial_id, self._config.searcher, running.length)
        if early or metric is None:
            why = f"exited early ({early})" if early else missing_metric_reason(self._config.searcher, running.length)
            if why is not None:
                self._say(f"trial {trial_id} {why}")
            self.store.set_trial_state(trial_id, RunState.COMPLETED, why)
            self._collect([trial_id])
            self._add_requests(self._searcher.on_trial_exited_early(work.request_id))
            return
        self._add_requests(self._searcher.on_validation(work.request_id, running.length, metric))
        following = self._searcher.next_length(work.request_id)
        if following is not None and following > running.length:
            self.store.set_trial_state(trial_id, RunState.ACTIVE)
            self._queue.insert(0, work)
        else:
            self.store.set_trial_state(trial_id, RunState.COMPLETED)
            self._ended_by_searcher[trial_id] = (work, running.length)
            self._collect([trial_id])
        self._requeue_promoted()

    def _on_preempted(self, running: _Running) -> None:
        trial_id = _trial_id(running.work)
        if self._failure is not None:
            self.store.set_trial_state(trial_id, RunState.CANCELED, "stopped: another trial failed the experiment")
            self._collect([trial_id])
        elif self._pausing:
            self.store.set_trial_state(trial_id, RunState.PAUSED, "experiment paused")
            self._queue.insert(0, running.work)
        else:
            self._say(f"trial {trial_id} was preempted: resuming it from its latest checkpoint")
            self._queue.insert(0, running.work)

    def _on_failed(self, running: _Running, code: int) -> None:
        work, trial_id = running.work, _trial_id(running.work)
        reason = running.proc.reason(code)
        limit = self._config.max_restarts
        previous = self.store.trial(trial_id)
        before, self._last_failure[trial_id] = self._last_failure.get(trial_id), reason
        if _same_failure(before, reason) and not self._reported_anything(trial_id):
            self.store.set_trial_state(trial_id, RunState.ERROR, reason)
            self._failure = f"trial {trial_id} failed twice the same way before reporting anything: {reason}"
            self._say(f"trial {trial_id} failed again the same way before its first report: not restarting it")
            self._end_failed(work)
            return
        if previous.restarts < limit:
            restarts = self.store.increment_trial_restarts(trial_id)
            self._say(f"trial {trial_id} failed; restart {restarts} of {limit} from its latest checkpoint")
            self.store.set_trial_state(trial_id, RunState.ACTIVE, reason)
            self._queue.insert(0, work)
            return
        self.store.set_trial_state(trial_id, RunState.ERROR, reason)
        self._failure = f"trial {trial_id} failed and max_restarts ({limit}) is used up: {reason}"
        self._say(f"trial {trial_id} failed after {limit} restart(s): the experiment fails")
        self._end_failed(work)

    def _end_failed(self, work: Work) -> None:
        self._searcher.on_trial_exited_early(work.request_id)
        self._collect([_trial_id(work)])
        for other in self._running.values():
            other.proc.terminate()

    def _reported_anything(self, trial_id: int) -> bool:
        """Whether the trial ever got as far as a metrics report or a checkpoint."""
        return bool(self.store.metrics(trial_id) or self.store.checkpoints(trial_id=trial_id, include_deleted=True))

    def _op_metric(self, trial_id: int, length: int) -> float | None:
        done = [op for op in self.store.searcher_ops(trial_id) if op.completed and op.length == length]
        return done[-1].metric if done else None

    def _add_requests(self, requests: list[Any]) -> None:
        self._queue.extend(Work(r.request_id, dict(r.hparams), int(r.seed)) for r in requests)

    def _requeue_promoted(self) -> None:
        """Trials the searcher had stopped but now gives a longer length (a later ASHA promotion)."""
        for trial_id, (work, length) in list(self._ended_by_searcher.items()):
            following = self._searcher.next_length(work.request_id)
            if following is not None and following > length:
                del self._ended_by_searcher[trial_id]
                self.store.set_trial_state(trial_id, RunState.ACTIVE)
                self._queue.insert(0, work)

    # -- the end ----------------------------------------------------------------------------------
    def _collect(self, trial_ids: list[int]) -> None:
        collect_garbage(self.store, self._storage, self.experiment_id, trial_ids, self._policy)

    def _finish(self) -> str:
        self._executor.close()
        self._display.close()
        if self._canceled:
            state, reason = RunState.CANCELED, KILLED_REASON
            for trial in self.store.trials(self.experiment_id):
                if trial.state not in RunState.TERMINAL:
                    self.store.set_trial_state(trial.id, RunState.CANCELED, "experiment killed")
            self._queue.clear()
        elif self._failure is not None:
            state, reason = RunState.ERROR, self._failure
            for trial in self.store.trials(self.experiment_id):
                if trial.state not in RunState.TERMINAL:
                    self.store.set_trial_state(trial.id, RunState.CANCELED, "the experiment failed")
            self._queue.clear()
        elif self._pausing:
            state = RunState.PAUSED
            for work in self._queue:
                if work.trial_id is not None and self.store.trial(work.trial_id).state == RunState.ACTIVE:
                    self.store.set_trial_state(work.trial_id, RunState.PAUSED, "experiment paused")
            reason = f"paused; resume with `det-trials experiment continue {self.experiment_id}`"
        else:
            state, reason = RunState.COMPLETED, None
        ended = [t.id for t in self.store.trials(self.experiment_id) if t.state in RunState.TERMINAL]
        self._collect(ended)
        self.store.set_searcher_state(self.experiment_id, self.state_dict())
        self.store.set_experiment_state(self.experiment_id, state, reason)
        return state.value  # the plain text, as the store's records hold it

    def _say(self, message: str) -> None:
        self._display.echo(f"det-trials: {message}")


def _same_failure(before: str | None, now: str) -> bool:
    """The same failure again (a deterministic one): same exit status and last line (paths aside)."""
    return before is not None and before.split(" (whole output: ")[0] == now.split(" (whole output: ")[0]


def _trial_id(work: Work) -> int:
    assert work.trial_id is not None
    return work.trial_id


@contextlib.contextmanager
def _stop_signals(handler: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call ``handler`` while the block runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        handler()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
