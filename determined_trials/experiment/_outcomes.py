"""What the runner does when a trial's process exits: feed the searcher, continue or end the trial, restart
it after a failure (within ``max_restarts``), requeue it after a preemption or pause, or fail the experiment."""

from __future__ import annotations

import signal

from determined_trials.core.store import RunState, recover_checkpoints
from determined_trials.core.trackers import Outcome, settle_trial_runs
from determined_trials.experiment._reported import metric_from_validations, missing_metric_reason
from determined_trials.experiment._runner_state import RunnerState, RunningTrial, Work
from determined_trials.launch import PREEMPTED_EXIT_CODE
from determined_trials.searcher import TrialRequest

__all__ = ["TrialOutcomes", "killed_from_outside"]

# Signals sent from outside the trial (an OOM killer, a node agent, a person): a death by one says nothing
# about the trial's code. A crash the process brings on itself (SIGSEGV, SIGABRT, SIGBUS, ...) does.
_OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
_WAITING = "waiting for the rest of the population to finish the round"


class TrialOutcomes(RunnerState):
    """The runner's handling of trial exits: done, preempted or paused, failed."""

    def _on_exit(self, running: RunningTrial, code: int) -> None:
        self._echo_for(_trial_id(running.work)).flush()
        trial = self.store.trial(_trial_id(running.work))
        if self._canceled:
            self.store.set_trial_state(trial.id, RunState.CANCELED, "experiment killed")
            settle_trial_runs(self.store, self._config, trial.id, Outcome.CANCELED)
            self._collect([trial.id])
        elif code == 0 and trial.state != RunState.PAUSED:
            self._on_done(running)
        elif code == PREEMPTED_EXIT_CODE or trial.state == RunState.PAUSED or running.proc.terminated:
            self._on_preempted(running)
        else:
            self._on_failed(running, code)

    def _on_done(self, running: RunningTrial) -> None:
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
            self._add_requests(self._searcher.on_trial_exited_early(work.request_id), work)
            self._requeue_promoted()  # an early exit may end a PBT round too
            return
        self._add_requests(self._searcher.on_validation(work.request_id, running.length, metric), work)
        following = self._searcher.next_length(work.request_id)
        if following is not None and following > running.length:
            self.store.set_trial_state(trial_id, RunState.ACTIVE)
            self._queue.insert(0, work)
        elif self._waiting(work):  # PBT: done with this round, kept (checkpoints too) until the round ends
            self.store.set_trial_state(trial_id, RunState.PAUSED, _WAITING)
            self._ended_by_searcher[trial_id] = (work, running.length)
        else:
            self.store.set_trial_state(trial_id, RunState.COMPLETED)
            self._ended_by_searcher[trial_id] = (work, running.length)
            self._collect([trial_id])
        self._requeue_promoted()

    def _on_preempted(self, running: RunningTrial) -> None:
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

    def _on_failed(self, running: RunningTrial, code: int) -> None:
        work, trial_id = running.work, _trial_id(running.work)
        reason = running.proc.reason(code)
        limit = self._config.max_restarts
        previous = self.store.trial(trial_id)
        before, self._last_failure[trial_id] = self._last_failure.get(trial_id), reason
        if not killed_from_outside(code) and _same_failure(before, reason) and not self._reported_anything(trial_id):
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
        settle_trial_runs(self.store, self._config, _trial_id(work), Outcome.GAVE_UP)  # its last reports are final
        self._searcher.on_trial_exited_early(work.request_id)
        self._collect([_trial_id(work)])
        for other in self._running.values():
            other.proc.terminate()

    def _reported_anything(self, trial_id: int) -> bool:
        """Whether the trial ever got as far as a metrics report or a checkpoint."""
        store = self.store
        return bool(store.metrics(trial_id, include_superseded=True)
                    or store.checkpoints(trial_id=trial_id, include_deleted=True))

    def _op_metric(self, trial_id: int, length: int) -> float | None:
        done = [op for op in self.store.searcher_ops(trial_id) if op.completed and op.length == length]
        return done[-1].metric if done else None

    def _add_requests(self, requests: list[TrialRequest], current: Work) -> None:
        """Queue the searcher's new trials (``current``: the trial whose end the searcher was just told)."""
        for r in requests:
            work = Work(r.request_id, dict(r.hparams), int(r.seed), search_round=r.search_round)
            if r.parent_request_id is not None:
                work.parent_trial_id, work.warm_start = self._parent_checkpoint(r.parent_request_id, current)
            self._queue.append(work)

    def _parent_checkpoint(self, request_id: int, current: Work) -> tuple[int, str]:
        """The trial of request ``request_id`` and its latest checkpoint, which a PBT child starts from."""
        known = [w for w, _ in self._ended_by_searcher.values()] + [r.work for r in self._running.values()]
        known += [*self._queue, current]
        trial_id = next((w.trial_id for w in known if w.request_id == request_id and w.trial_id is not None), None)
        if trial_id is None:
            raise RuntimeError(f"the searcher named request {request_id} as a parent, but no trial of it is known")
        recover_checkpoints(self.store, self._storage, trial_id)
        latest = self.store.latest_checkpoint(trial_id)
        if latest is None:
            raise RuntimeError(f"trial {trial_id} is a PBT parent but wrote no checkpoint: a trial must checkpoint "
                               "at the end of each round (the Trainer does; a Core API script must store_path)")
        return trial_id, latest.uuid

    def _waiting(self, work: Work) -> bool:
        return self._searcher.waiting(work.request_id)  # e.g. PBT's member until its round ends

    def _requeue_promoted(self) -> None:
        """Trials the searcher had stopped but now gives a longer length (a later ASHA promotion, PBT's next
        round); a trial that waited for its round's end and is not continued ends now."""
        for trial_id, (work, length) in list(self._ended_by_searcher.items()):
            following = self._searcher.next_length(work.request_id)
            if following is not None and following > length:
                del self._ended_by_searcher[trial_id]
                self.store.set_trial_state(trial_id, RunState.ACTIVE)
                self._queue.insert(0, work)
            elif not self._waiting(work) and self.store.trial(trial_id).state == RunState.PAUSED:
                self.store.set_trial_state(trial_id, RunState.COMPLETED)
                self._collect([trial_id])


def killed_from_outside(code: int) -> bool:
    """Whether a trial process's exit status ``code`` is a death by an outside signal: ``-N`` (the process
    itself killed by signal N) or ``128 + N`` (a launcher's or shell's status for a rank or child killed
    by N). Such a failure counts against ``max_restarts`` only, never as "the same failure twice"."""
    number = -code if code < 0 else code - 128
    return number in _OUTSIDE_SIGNALS


def _same_failure(before: str | None, now: str) -> bool:
    """The same failure again (a deterministic one): same exit status and last line (paths aside)."""
    return before is not None and before.split(" (whole output: ")[0] == now.split(" (whole output: ")[0]


def _trial_id(work: Work) -> int:
    assert work.trial_id is not None
    return work.trial_id
