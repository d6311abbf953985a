"""`OptunaSearch`: Optuna's samplers through ask and tell, on our rungs and concurrency limit; its study lives in
memory and its record in the searcher's state (which the runner saves in the store with its own), so that
`experiment continue` rebuilds the same study."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from determined_trials.searcher._base import trial_seed
from determined_trials.searcher._optuna_record import StudyRecorder, restore_study
from determined_trials.searcher._optuna_space import OptunaSpace
from determined_trials.searcher._optuna_study import import_optuna, make_sampler, open_study, quiet
from determined_trials.searcher._rungs import RungSearch

__all__ = ["OptunaSearch"]

Pruner = Literal["none", "asha", "median"]


class OptunaSearch(RungSearch):
    """`max_trials` trials, each asked of Optuna's `sampler` when a slot is free and told its searcher
    metric when it ends (COMPLETE), is stopped at a rung (PRUNED, with its last rung value) or exits early
    (FAIL). With a pruner, trials report at rungs (lengths as adaptive_asha's); each rung value is reported
    to Optuna, and the decision is adaptive_asha's promotion rule (`asha`) or Optuna's MedianPruner
    (`median`). Each suggestion uses a sampler seeded from the experiment seed and the request id, so one
    trial at a time gives the same hparams for the same seed, before and after a restart of the runner.

    The study is in Optuna's in-memory storage; `state_dict()` carries its record (every trial's params,
    values, intermediate values and sampler attributes) and `load_state_dict()` rebuilds it, so the study and
    the search's own state are saved together, in one write of the runner's state."""

    kind = "optuna"

    def __init__(
        self, space: Mapping[str, Any], *, max_length: int, max_trials: int, experiment_seed: int,
        max_concurrent: int = 0, sampler: str = "tpe", pruner: Pruner = "none", divisor: float = 4.0,
        rung_lengths: list[int] | None = None, smaller_is_better: bool = True,
    ) -> None:
        """`rung_lengths`: with a pruner, the lengths trials report at (`asha_rung_lengths`)."""
        import_optuna()
        lengths = [max_length] if pruner == "none" else list(rung_lengths or [max_length])
        super().__init__(
            rung_lengths=lengths, max_trials=max_trials, max_concurrent=max_concurrent,
            experiment_seed=experiment_seed, divisor=divisor, smaller_is_better=smaller_is_better,
        )
        self._space = OptunaSpace(space)
        self._sampler_name = sampler
        make_sampler(sampler, seed=0, experiment_seed=experiment_seed)  # a missing sampler package fails here
        self._pruner = pruner
        self._study_obj: Any = None
        self._recorder = StudyRecorder(self._space.distributions)
        self._numbers: dict[int, int] = {}  # request id -> Optuna trial number
        self._live: dict[int, Any] = {}  # request id -> the optuna.Trial asked (or rebuilt) in this process

    # -- the runner's hook -------------------------------------------------------------------------
    def cap_in_flight(self, max_parallel: int) -> None:
        """Never ask more trials than the runner runs at once, so that every suggestion sees the results the
        runner could have had."""
        if max_parallel >= 1:
            self._max_concurrent = min(self._max_concurrent or max_parallel, max_parallel)

    def tell_earlier(self, trials: Iterable[tuple[str, Mapping[str, Any], float]]) -> tuple[int, list[str]]:
        """Add finished trials of earlier searches, (label, hparams, searcher metric) each, to the study as
        COMPLETE trials, before its first suggestion (`searcher.warm_start`); those whose hyperparameters do not
        fit this space are skipped. Returns (how many were added, why each skipped one was: "label: why"). The
        study's record carries them from then on, so a continued search rebuilds them and adds nothing again."""
        if self._numbers:
            raise RuntimeError("earlier trials are told to the study before its first suggestion")
        optuna = import_optuna()
        added, skipped = [], []
        for label, hparams, value in trials:
            params, why = self._space.params(hparams)
            if params is None:
                skipped.append(f"{label}: {why}")
                continue
            used = {name: self._space.distributions[name] for name in params}
            added.append(optuna.trial.create_trial(params=params, distributions=used, value=float(value)))
        with quiet():
            self.study.add_trials(added)
        return len(added), skipped

    # -- views ------------------------------------------------------------------------------------
    @property
    def study(self) -> Any:
        """The `optuna.Study` (made on first use, rebuilt by `load_state_dict`)."""
        if self._study_obj is None:
            self._study_obj = open_study(
                smaller_is_better=self._smaller, median_pruner=self._pruner == "median",
                sampler=make_sampler(self._sampler_name, seed=self._seed, experiment_seed=self._seed),
            )
        return self._study_obj

    def trial_number(self, request_id: int) -> int:
        """The Optuna trial number of request `request_id`."""
        return self._numbers[request_id]

    # -- RungSearch's hooks -----------------------------------------------------------------------
    def _hparams_for(self, request_id: int) -> dict[str, Any]:
        study = self.study
        study.sampler = make_sampler(  # a seed of its own per request (not the trial's seed)
            self._sampler_name, seed=trial_seed(self._seed, -1 - request_id), experiment_seed=self._seed)
        with quiet():
            trial = study.ask(self._space.distributions)
        self._numbers[request_id] = trial.number
        self._live[request_id] = trial
        return self._space.hparams(trial.params)

    def _promotes(self, entries: list[tuple[float, int]], request_id: int, length: int) -> bool:
        trial = self._live_trial(request_id)
        with quiet():
            trial.report(entries[-1][0], length)
        if self._pruner == "median":
            return not trial.should_prune()
        return super()._promotes(entries, request_id, length)

    def _decided(self, request_id: int, metric: float | None) -> None:
        state = self.trial_state(request_id)
        if state == "running":
            return
        self._live.pop(request_id, None)
        states = import_optuna().trial.TrialState
        number = self._numbers[request_id]
        with quiet():
            if state == "completed":
                self.study.tell(number, metric)
            elif state == "stopped":
                self.study.tell(number, state=states.PRUNED)
            else:
                self.study.tell(number, state=states.FAIL)

    def _extra_state(self) -> dict[str, Any]:
        return {"optuna_trials": [[rid, number] for rid, number in self._numbers.items()],
                "sampler": self._sampler_name, "pruner": self._pruner, "study": self._recorder.record(self.study)}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        saved = (state.get("sampler"), state.get("pruner"), (state.get("study") or {}).get("direction"))
        ours = (self._sampler_name, self._pruner, "MINIMIZE" if self._smaller else "MAXIMIZE")
        if saved != ours:
            raise ValueError(f"the saved optuna search has (sampler, pruner, direction) {saved}, the config asks "
                             f"for {ours}; continue the experiment with the config it was created with")
        self._numbers = {int(rid): int(number) for rid, number in state["optuna_trials"]}
        record = state["study"]
        self._study_obj = restore_study(
            record, median_pruner=self._pruner == "median",
            sampler=make_sampler(self._sampler_name, seed=self._seed, experiment_seed=self._seed))
        self._recorder.remember(record)
        self._live = {}

    # -- internals --------------------------------------------------------------------------------
    def _live_trial(self, request_id: int) -> Any:
        """The optuna.Trial of a running request (rebuilt from the study after a restart of the runner)."""
        if request_id not in self._live:
            optuna = import_optuna()
            frozen = self.study.get_trials(deepcopy=False)[self._numbers[request_id]]
            self._live[request_id] = optuna.trial.Trial(self.study, frozen._trial_id)
        return self._live[request_id]
