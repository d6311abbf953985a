"""``ExperimentRunner``: the master's part on one machine. It creates the searcher's trials, runs their
processes (a few at once at most), feeds completed operations back to the searcher, restarts failed
trials from their latest checkpoint, and pauses everything on SIGINT/SIGTERM, resumably (or, when
`det-trials experiment kill` marked the experiment CANCELED first, stops its trials now and ends CANCELED)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from determined_trials.core.store import RunState, claim_experiment, recover_checkpoints
from determined_trials.experiment._executor import TrialJob
from determined_trials.experiment._launch import TrialLaunch
from determined_trials.experiment._outcomes import TrialOutcomes
from determined_trials.experiment._runner_state import RunningTrial, Work

__all__ = ["KILLED_REASON", "ExperimentRunner"]

_POLL_S = 0.05
KILLED_REASON = "killed (from the dashboard or with `det-trials experiment kill`)"  # the store cannot tell which


class ExperimentRunner(TrialOutcomes):
    """Runs one experiment of the store to its end, or until paused; see ``run()``. Its state and saved state
    are ``RunnerState``'s (``_runner_state``), what it does when a trial exits ``TrialOutcomes``' (``_outcomes``)."""

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
                self._storage.check()  # a missing bucket or refused credentials: before any trial starts
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
            self._stamp_queued()
            stopping = self._pausing or self._failure is not None
            while not stopping and self._queue and len(self._running) < self._max_parallel:
                self._start(self._queue[0])  # leaves the queue once running: a kill in between loses nothing
            if not self._running and (stopping or not self._queue):
                return
            reaped = self._reap()
            self._stamp_queued()
            self._display.update(self._searcher.progress())
            if not reaped:  # an exit may have queued the next trial: start it now, not a poll later
                self._trial_news.wait(_POLL_S)  # a trial's end wakes it at once (signals: a poll later)
                self._trial_news.clear()

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

    def _reap(self) -> bool:
        """Handle the trial processes that ended; whether there was one."""
        reaped = False
        for trial_id, running in list(self._running.items()):
            code = running.proc.poll()
            if code is not None:
                reaped = True
                del self._running[trial_id]
                self.store.end_trial_attempt(trial_id)  # the attempt's wall: queued to the process's exit
                self._free_gpus.extend(running.gpus)
                self._on_exit(running, code)
                self._save_state()
        return reaped

    # -- starting ---------------------------------------------------------------------------------
    def _start(self, work: Work) -> None:
        if work.trial_id is None:
            work.trial_id = self.store.create_trial(
                experiment_id=self.experiment_id, hparams=work.hparams, seed=work.seed,
                parent_trial_id=work.parent_trial_id, parent_checkpoint=work.warm_start,
                search_round=work.search_round,
            )
            self._save_state()  # the new trial is in the saved queue: a killed runner's `continue` runs it, once
        trial_id = work.trial_id
        length = self._searcher.next_length(work.request_id)
        if length is None:
            self._queue.remove(work)
            self._queued_since.pop(work.request_id, None)
            self.store.set_trial_state(trial_id, RunState.COMPLETED, "stopped by the searcher")
            self._collect([trial_id])
            return
        trial = self.store.trial(trial_id)
        recover_checkpoints(self.store, self._storage, trial_id)  # a checkpoint published before a kill counts
        latest = self.store.latest_checkpoint(trial_id)
        if latest is None and work.warm_start is not None:  # a PBT child: its parent's checkpoint is its own
            latest = self.store.checkpoint(work.warm_start)
        warm = self._warm_start if latest is None else None  # searcher.source_*: a trial without a checkpoint
        launch = TrialLaunch(
            experiment_id=self.experiment_id, trial_id=trial_id, hparams=work.hparams, seed=work.seed,
            config=self._config_dict, length=int(length), latest_checkpoint=latest.uuid if latest else None,
            steps_completed=latest.steps_completed if latest else 0, run_id=1 + trial.restarts,
            warm_start_checkpoint=warm.checkpoint if warm else None,
        )
        trial_dir = self._exp_dir / f"trial_{trial_id}"
        gpus = self._take_gpus()
        self.store.set_trial_state(trial_id, RunState.ACTIVE)
        where = f" from checkpoint {latest.uuid} (step {latest.steps_completed})" if latest else ""
        where = where or (f" from the model weights of checkpoint {warm.checkpoint} (a warm start)" if warm else "")
        self._say(f"trial {trial_id} starts{where}: training to {self._length_text(int(length))}")
        self._attempt_starts(work, trial_id)
        proc = self._executor.start(TrialJob(
            launch=launch, entrypoint=self._config.entrypoint, slots=self._config.resources.slots_per_trial,
            run_dir=self.store.path, trial_dir=trial_dir, model_dir=self._model_dir, config_path=self._config_path,
            log_path=self._exp_dir / f"trial_{trial_id}.log", echo=self._echo_for(trial_id), gpus=tuple(gpus),
            wake=self._trial_news.set,
        ))
        self._queue.remove(work)
        self._running[trial_id] = RunningTrial(work, int(length), proc, gpus)
        self._save_state()
        if self._pausing:
            proc.terminate()


    def _length_text(self, length: int) -> str:
        """A searcher length with its unit: ``6 epochs``, ``8 tokens`` (a time_metric), else ``length 6``."""
        searcher = self._config.searcher
        unit = searcher.max_length.unit if searcher.max_length is not None else getattr(searcher, "time_metric", None)
        return f"{length} {unit}" if unit else f"length {length}"
    def _take_gpus(self) -> list[str]:
        count = min(self._config.resources.slots_per_trial, len(self._free_gpus))
        taken, self._free_gpus = self._free_gpus[:count], self._free_gpus[count:]
        return taken

    # -- the end ----------------------------------------------------------------------------------
    def _finish(self) -> str:
        self._unqueue_all()
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
