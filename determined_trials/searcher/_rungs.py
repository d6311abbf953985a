"""The shared search engine: trials climb a ladder of rung lengths under a concurrency limit.

A one-rung ladder is a plain search (single, grid, random); several rungs are ASHA.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from determined_trials.searcher._base import Searcher, TrialRequest, trial_seed

__all__ = ["RungSearch", "promotes"]

_RUNNING, _COMPLETED, _STOPPED, _EXITED = "running", "completed", "stopped", "exited"
_STATE_VERSION = 1


@dataclass
class _Trial:
    request_id: int
    hparams: dict[str, Any]
    seed: int
    rung: int = 0
    state: str = _RUNNING
    length: int = 0  # the largest length reported so far


def _sort_key(metric: float, smaller_is_better: bool) -> float:
    """Smaller key = better; NaN is worst."""
    if math.isnan(metric):
        return math.inf
    return metric if smaller_is_better else -metric


def promotes(entries: list[tuple[float, int]], request_id: int, divisor: float, smaller_is_better: bool) -> bool:
    """The promotion rule. `entries` are the (metric, request_id) reported at one rung, in report
    order, the deciding report last. With n entries, k = max(1, floor(n / divisor)); the trial is
    promoted iff its metric is among the k best (ties: the earlier report ranks higher)."""
    keep = max(1, math.floor(len(entries) / divisor + 1e-9))
    order = sorted(range(len(entries)), key=lambda i: (_sort_key(entries[i][0], smaller_is_better), i))
    return any(entries[i][1] == request_id for i in order[:keep])


class RungSearch(Searcher):
    """Creates up to `max_trials` trials, at most `max_concurrent` (0 = no limit) running at once;
    each trains to `rung_lengths[0]`, then is promoted rung by rung or stopped (see `promotes`)."""

    kind: ClassVar[str] = "rungs"

    def __init__(
        self, *, rung_lengths: list[int], max_trials: int, max_concurrent: int, experiment_seed: int,
        divisor: float = 4.0, smaller_is_better: bool = True,
    ) -> None:
        if not rung_lengths or any(b <= a for a, b in zip(rung_lengths, rung_lengths[1:])) or rung_lengths[0] < 1:
            raise ValueError(f"rung lengths must be increasing integers >= 1, got {rung_lengths}")
        if max_trials < 1 or max_concurrent < 0:
            raise ValueError(f"need max_trials >= 1 and max_concurrent >= 0, got {max_trials}, {max_concurrent}")
        self._lengths = list(rung_lengths)
        self._max_trials = max_trials
        self._max_concurrent = max_concurrent
        self._seed = experiment_seed
        self._divisor = divisor
        self._smaller = smaller_is_better
        self._trials: dict[int, _Trial] = {}
        self._saved_finished: dict[int, dict[str, Any]] = {}  # request id -> a finished trial's saved form
        self._rungs: list[list[tuple[float, int]]] = [[] for _ in rung_lengths]

    # -- what subclasses provide -------------------------------------------------------------
    def _hparams_for(self, request_id: int) -> dict[str, Any]:
        """The hparams of the next trial (called once per trial, in request-id order)."""
        raise NotImplementedError

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    def _promotes(self, entries: list[tuple[float, int]], request_id: int, length: int) -> bool:
        """Whether the trial reporting the last of `entries` at a rung below the last goes on (`promotes`)."""
        return promotes(entries, request_id, self._divisor, self._smaller)

    def _decided(self, request_id: int, metric: float | None) -> None:
        """Called after each decided report (its metric) and early exit (None), before new trials are made."""

    # -- read-only views ---------------------------------------------------------------------
    @property
    def experiment_seed(self) -> int:
        """The seed every trial seed and sampled hparam derives from."""
        return self._seed

    @property
    def rung_lengths(self) -> list[int]:
        """The absolute length of each rung; the last is the full length."""
        return list(self._lengths)

    @property
    def max_trials(self) -> int:
        """How many trials the search creates in total."""
        return self._max_trials

    def trial_state(self, request_id: int) -> str:
        """'running', 'completed' (reached the last rung), 'stopped' (not promoted) or 'exited'."""
        return self._trial(request_id).state

    def running(self) -> list[int]:
        """The request ids of the trials still running."""
        return [rid for rid, t in self._trials.items() if t.state == _RUNNING]

    # -- the Searcher protocol ---------------------------------------------------------------
    def initial_trials(self) -> list[TrialRequest]:
        """The first trials; called again, it returns only what free slots allow (normally none)."""
        return self._fill()

    def next_length(self, request_id: int) -> int | None:
        trial = self._trial(request_id)
        return self._lengths[trial.rung] if trial.state == _RUNNING else None

    def on_validation(self, request_id: int, length: int, metric: float) -> list[TrialRequest]:
        """Records the metric when `length` reaches the trial's rung, then promotes, stops or
        completes it; reports for finished trials or below the rung length change nothing."""
        trial = self._trial(request_id)
        if trial.state != _RUNNING:
            return []
        trial.length = max(trial.length, int(length))
        if length < self._lengths[trial.rung]:
            return []
        entries = self._rungs[trial.rung]
        entries.append((float(metric), request_id))
        if trial.rung == len(self._lengths) - 1:
            trial.state = _COMPLETED
        elif self._promotes(entries, request_id, int(length)):
            trial.rung += 1
        else:
            trial.state = _STOPPED
        self._decided(request_id, float(metric))
        return self._fill()

    def on_trial_exited_early(self, request_id: int) -> list[TrialRequest]:
        """The trial counts towards `max_trials` but frees its slot for the next one."""
        trial = self._trial(request_id)
        if trial.state == _RUNNING:
            trial.state = _EXITED
            self._decided(request_id, None)
        return self._fill()

    def is_done(self) -> bool:
        return len(self._trials) >= self._max_trials and not self.running()

    def progress(self) -> float:
        """(finished trials + each running trial's reported length / full length) / max_trials."""
        if self.is_done():
            return 1.0
        full = self._lengths[-1]
        done = sum(1.0 if t.state != _RUNNING else min(t.length / full, 1.0) for t in self._trials.values())
        return min(done / self._max_trials, 1.0)

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION, "kind": self.kind, "experiment_seed": self._seed,
            "rung_lengths": list(self._lengths), "max_trials": self._max_trials,
            "trials": [self._saved_trial(t) for t in self._trials.values()],
            "rungs": [[[m, rid] for m, rid in entries] for entries in self._rungs],
            **self._extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_compatible(state)
        self._seed = int(state["experiment_seed"])
        self._trials = {int(t["request_id"]): _Trial(**t) for t in state["trials"]}
        self._saved_finished = {}
        self._rungs = [[(float(m), int(rid)) for m, rid in entries] for entries in state["rungs"]]
        self._load_extra_state(state)

    # -- internals ---------------------------------------------------------------------------
    def _check_compatible(self, state: dict[str, Any]) -> None:
        theirs = (state.get("version"), state.get("kind"), state.get("rung_lengths"), state.get("max_trials"))
        ours = (_STATE_VERSION, self.kind, self._lengths, self._max_trials)
        if theirs != ours:
            raise ValueError(
                f"this searcher state (version, kind, rung lengths, max_trials) = {theirs} does not match "
                f"the searcher built from the config {ours}; continue the experiment with the config it was "
                "created with"
            )

    def _saved_trial(self, trial: _Trial) -> dict[str, Any]:
        """`asdict(trial)`, made once for a finished trial (which no longer changes): a search of hundreds of
        trials saves its state at every trial's start and end."""
        saved = self._saved_finished.get(trial.request_id)
        if saved is None:
            saved = asdict(trial)
            if trial.state != _RUNNING:
                self._saved_finished[trial.request_id] = saved
        return saved

    def _trial(self, request_id: int) -> _Trial:
        try:
            return self._trials[request_id]
        except KeyError:
            raise KeyError(
                f"the searcher made no trial with request id {request_id}; known ids: {sorted(self._trials)}"
            ) from None

    def _fill(self) -> list[TrialRequest]:
        created: list[TrialRequest] = []
        running = len(self.running())
        while len(self._trials) < self._max_trials and (self._max_concurrent == 0 or running < self._max_concurrent):
            rid = len(self._trials)
            trial = _Trial(rid, self._hparams_for(rid), trial_seed(self._seed, rid))
            self._trials[rid] = trial
            running += 1
            created.append(TrialRequest(rid, copy.deepcopy(trial.hparams), trial.seed))
        return created
