"""The searcher interface: `TrialRequest`, the `Searcher` protocol and trial-seed derivation."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Searcher", "TrialRequest", "trial_seed"]

_SEED_MASK = 2**31 - 1


@dataclass(frozen=True)
class TrialRequest:
    """A trial the runner should create: the searcher's id for it, its hparams and its seed.

    A searcher that continues trials from others' checkpoints (PBT) also names the ``parent_request_id``
    whose latest checkpoint the new trial starts from (the runner resolves it to a checkpoint uuid when the
    request is made) and the ``search_round`` it starts in; both stay None for every other searcher."""

    request_id: int
    hparams: dict[str, Any]
    seed: int
    parent_request_id: int | None = None
    search_round: int | None = None


@runtime_checkable
class Searcher(Protocol):
    """Pure, deterministic search logic (given the experiment seed and the order of reports).

    Lengths are absolute, in the units of `searcher.max_length`. A searcher subclasses this protocol to
    inherit the defaults of the runner's optional questions (`cap_in_flight`, `waiting`).
    """

    def cap_in_flight(self, max_parallel: int) -> None:
        """The runner runs at most `max_parallel` trials at once (told once, before the first trial), e.g. so
        that Optuna never asks more trials than run. Default: nothing to do."""
        return None

    def waiting(self, request_id: int) -> bool:
        """Whether the trial, having reported, waits (PAUSED, with its checkpoints) until the searcher
        continues or closes it, e.g. PBT's member waiting for the round's end. Default: False."""
        return False

    def initial_trials(self) -> list[TrialRequest]:
        """The first trials to create (as many as the concurrency limit allows)."""

    def next_length(self, request_id: int) -> int | None:
        """The absolute length the trial should train to next; None = stop it (it is finished)."""

    def on_validation(self, request_id: int, length: int, metric: float) -> list[TrialRequest]:
        """The trial completed its operation of `length` with `metric`; returns trials to create."""

    def on_trial_exited_early(self, request_id: int) -> list[TrialRequest]:
        """The trial ended without completing (InvalidHP, failure); frees its slot."""

    def is_done(self) -> bool:
        """Every trial has been created and none is still running."""

    def progress(self) -> float:
        """Fraction of the search done, in [0, 1]."""

    def state_dict(self) -> dict[str, Any]:
        """The whole state as a JSON-able dict."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()` saved by a searcher of the same config."""


def trial_seed(experiment_seed: int, request_id: int) -> int:
    """The seed of trial `request_id`: a hash of both numbers, in 0..2**31-2 (stable across runs)."""
    digest = hashlib.sha256(f"det-trials-seed:{experiment_seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % _SEED_MASK
