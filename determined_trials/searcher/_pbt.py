"""Population-based training (Determined's `pbt` searcher): rounds of training, the worst replaced each
round by children of the best, which continue from their parent's checkpoint with explored hparams.

A round: every member of the population trains to the round's end (``round × length_per_round``,
absolute) and reports its metric. When the last one has reported (or exited early: it then ranks
worst), the members are ranked (best first, ties to the earlier request); the worst
``floor(truncate_fraction × population_size)`` are closed, the best as many each get a child
(``TrialRequest.parent_request_id``: it starts from the parent's latest checkpoint, with the parent's
seed, its hparams from ``explore_hparams``), and the rest go on to the next round. After ``num_rounds``
every member is closed. A member that has reported and waits for the round's end is ``waiting``: the
runner keeps it (and its checkpoints) until the searcher continues or closes it.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from determined_trials.config import sample_hparams
from determined_trials.searcher._base import Searcher, TrialRequest, trial_seed
from determined_trials.searcher._explore import explore_hparams
from determined_trials.searcher._rungs import _sort_key

__all__ = ["PBTSearch"]

_STATE_VERSION = 1
_LIVE, _CLOSED, _EXITED = "live", "closed", "exited"


@dataclass
class _Member:
    request_id: int
    hparams: dict[str, Any]
    seed: int
    parent: int | None
    born: int  # the round (from 1) it started in
    state: str = _LIVE


class PBTSearch(Searcher):
    """Determined's PBT over our hyperparameter space; lengths are absolute, in the units of
    ``length_per_round``. Pure and deterministic given the experiment seed and the order of reports."""

    kind: ClassVar[str] = "pbt"

    def __init__(
        self, space: dict[str, Any], *, population_size: int, num_rounds: int, length_per_round: int,
        truncate_fraction: float, resample_probability: float, perturb_factor: float,
        experiment_seed: int, smaller_is_better: bool = True,
    ) -> None:
        if population_size < 1 or num_rounds < 1 or length_per_round < 1:
            raise ValueError("population_size, num_rounds and length_per_round must be >= 1")
        self._space = dict(space)
        self._size = population_size
        self._rounds = num_rounds
        self._length = length_per_round
        self._truncate = int(truncate_fraction * population_size + 1e-9)
        self._resample = resample_probability
        self._perturb = perturb_factor
        self._seed = experiment_seed
        self._smaller = smaller_is_better
        self._rng = random.Random(experiment_seed)
        self._members: dict[int, _Member] = {}
        self._population: list[int] = []  # this round's members, in request order
        self._reports: dict[int, float] = {}  # this round's ranking keys (smaller = better)
        self._round = 1  # the round now running (num_rounds + 1 once the search is over)

    # -- read-only views ---------------------------------------------------------------------
    @property
    def experiment_seed(self) -> int:
        """The seed every sampled and explored hparam derives from."""
        return self._seed

    @property
    def current_round(self) -> int:
        """The round now running, from 1 (``num_rounds + 1`` when the search is over)."""
        return self._round

    @property
    def population(self) -> list[int]:
        """The request ids of this round's members (always ``population_size`` of them)."""
        return list(self._population)

    @property
    def replaced_per_round(self) -> int:
        """floor(truncate_fraction × population_size): members closed (and children made) each round."""
        return self._truncate

    def parent_of(self, request_id: int) -> int | None:
        """The request whose checkpoint the trial started from (None: a first-round trial)."""
        return self._member(request_id).parent

    def waiting(self, request_id: int) -> bool:
        """The trial reached this round's end and waits for the rest of the population."""
        member = self._member(request_id)
        return member.state == _LIVE and request_id in self._reports and self._round <= self._rounds

    # -- the Searcher protocol ---------------------------------------------------------------
    def initial_trials(self) -> list[TrialRequest]:
        """The first round's population (only once)."""
        if self._members:
            return []
        return [self._add(sample_hparams(self._space, self._rng), seed=None, parent=None)
                for _ in range(self._size)]

    def next_length(self, request_id: int) -> int | None:
        member = self._member(request_id)
        if member.state != _LIVE or request_id in self._reports or self._round > self._rounds:
            return None
        return self._round * self._length

    def on_validation(self, request_id: int, length: int, metric: float) -> list[TrialRequest]:
        """Records the metric of the round's end; the last report of a round ends it."""
        member = self._member(request_id)
        if member.state != _LIVE or request_id in self._reports or length < self._round * self._length:
            return []
        self._reports[request_id] = _sort_key(float(metric), self._smaller)
        return self._end_round_if_complete()

    def on_trial_exited_early(self, request_id: int) -> list[TrialRequest]:
        """The trial stays in the population, ranked worst, and never trains again."""
        member = self._member(request_id)
        if member.state == _LIVE:
            member.state = _EXITED
        if request_id in self._population:
            self._reports[request_id] = math.inf
        return self._end_round_if_complete()

    def is_done(self) -> bool:
        return bool(self._members) and not any(
            m.state == _LIVE and (self.next_length(m.request_id) is not None or self.waiting(m.request_id))
            for m in self._members.values()
        )

    def progress(self) -> float:
        """Member-rounds reported over population_size × num_rounds."""
        if self.is_done():
            return 1.0
        done = (self._round - 1) * self._size + len(self._reports)
        return min(done / (self._size * self._rounds), 1.0)

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self._rng.getstate()
        return {
            "version": _STATE_VERSION, "kind": self.kind, "experiment_seed": self._seed,
            "shape": self._shape(), "round": self._round, "population": list(self._population),
            "reports": [[rid, key] for rid, key in self._reports.items()],
            "members": [asdict(m) for m in self._members.values()], "rng": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        theirs = (state.get("version"), state.get("kind"), state.get("shape"))
        ours = (_STATE_VERSION, self.kind, self._shape())
        if theirs != ours:
            raise ValueError(
                f"this searcher state (version, kind, shape) = {theirs} does not match the searcher built from "
                f"the config {ours}; continue the experiment with the config it was created with"
            )
        self._seed = int(state["experiment_seed"])
        self._round = int(state["round"])
        self._population = [int(r) for r in state["population"]]
        self._reports = {int(rid): float(key) for rid, key in state["reports"]}
        self._members = {int(m["request_id"]): _Member(**m) for m in state["members"]}
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    # -- internals ---------------------------------------------------------------------------
    def _shape(self) -> list[Any]:
        return [self._size, self._rounds, self._length, self._truncate, self._resample, self._perturb]

    def _member(self, request_id: int) -> _Member:
        try:
            return self._members[request_id]
        except KeyError:
            raise KeyError(
                f"the searcher made no trial with request id {request_id}; known ids: {sorted(self._members)}"
            ) from None

    def _add(self, hparams: dict[str, Any], *, seed: int | None, parent: int | None) -> TrialRequest:
        rid = len(self._members)
        member = _Member(rid, hparams, trial_seed(self._seed, rid) if seed is None else seed, parent, self._round)
        self._members[rid] = member
        self._population.append(rid)
        return TrialRequest(rid, copy.deepcopy(hparams), member.seed, parent_request_id=parent,
                            search_round=member.born)

    def _end_round_if_complete(self) -> list[TrialRequest]:
        if self._round > self._rounds or any(rid not in self._reports for rid in self._population):
            return []
        ranked = sorted(self._population, key=lambda rid: (self._reports[rid], rid))
        self._round += 1
        self._reports = {}
        if self._round > self._rounds:
            self._close(ranked)
            return []
        keep = len(ranked) - self._truncate
        self._close(ranked[keep:])
        self._population = [rid for rid in ranked[:keep]]
        for rid in self._population:
            if self._members[rid].state == _EXITED:
                self._reports[rid] = math.inf  # a dead member keeps its place, ranked worst (as Determined)
        children = []
        for rid in ranked[:self._truncate]:
            parent = self._members[rid]
            if parent.state == _EXITED:
                continue
            hparams = explore_hparams(self._space, parent.hparams, self._rng,
                                      resample_probability=self._resample, perturb_factor=self._perturb)
            children.append(self._add(hparams, seed=parent.seed, parent=rid))
        self._population.sort()
        return children

    def _close(self, request_ids: list[int]) -> None:
        for rid in request_ids:
            if self._members[rid].state == _LIVE:
                self._members[rid].state = _CLOSED
