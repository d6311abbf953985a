"""`OptunaSearch`: Optuna's samplers through ask and tell, on our rungs and concurrency limit, its study in
Optuna's journal file in the experiment's folder so that `experiment continue` goes on with the same study."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from determined_trials.searcher._base import trial_seed
from determined_trials.searcher._optuna_space import OptunaSpace
from determined_trials.searcher._optuna_study import STUDY_FILE, import_optuna, make_sampler, open_study, quiet
from determined_trials.searcher._rungs import RungSearch

__all__ = ["OptunaSearch"]

Pruner = Literal["none", "asha", "median"]


class OptunaSearch(RungSearch):
    """`max_trials` trials, each asked of Optuna's `sampler` when a slot is free and told its searcher
    metric when it ends (COMPLETE), is stopped at a rung (PRUNED, with its last rung value) or exits early
    (FAIL). With a pruner, trials report at rungs (lengths as adaptive_asha's); each rung value is reported
    to Optuna, and the decision is adaptive_asha's promotion rule (`asha`) or Optuna's MedianPruner
    (`median`). Each suggestion uses a sampler seeded from the experiment seed and the request id, so one
    trial at a time gives the same hparams for the same seed, before and after a restart of the runner."""

    kind = "optuna"

    def __init__(
        self, space: Mapping[str, Any], *, max_length: int, max_trials: int, experiment_seed: int,
        max_concurrent: int = 0, sampler: str = "tpe", pruner: Pruner = "none", divisor: float = 4.0,
        rung_lengths: list[int] | None = None, smaller_is_better: bool = True, study_path: Path | None = None,
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
        self._study_path = study_path
        self._study_obj: Any = None
        self._numbers: dict[int, int] = {}  # request id -> Optuna trial number
        self._told_before: dict[int, str] = {}  # request id -> Optuna's state, told before the runner was killed
        self._live: dict[int, Any] = {}  # request id -> the optuna.Trial asked in this process

    # -- the runner's hook -------------------------------------------------------------------------
    def attach(self, exp_dir: Path, max_parallel: int) -> None:
        """Keep the study in `exp_dir` (before the first trial is asked) and never ask more trials than the
        runner runs at once, so that every suggestion sees the results the runner could have had."""
        if self._study_obj is None:
            self._study_path = Path(exp_dir) / STUDY_FILE
        if max_parallel >= 1:
            self._max_concurrent = min(self._max_concurrent or max_parallel, max_parallel)

    # -- views ------------------------------------------------------------------------------------
    @property
    def study(self) -> Any:
        """The `optuna.Study` (opened on first use)."""
        if self._study_obj is None:
            self._study_obj = open_study(
                self._study_path, smaller_is_better=self._smaller, median_pruner=self._pruner == "median",
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
        before = self._told_before.pop(request_id, None)
        if before is not None:  # decided before the runner was killed: Optuna's record stands
            return before == "RUNNING"
        trial = self._live_trial(request_id)
        metric = entries[-1][0]
        with quiet():
            trial.report(metric, length)
        if self._pruner == "median":
            return not trial.should_prune()
        return super()._promotes(entries, request_id, length)

    def _decided(self, request_id: int, metric: float | None) -> None:
        state = self.trial_state(request_id)
        if state == "running":
            return
        self._live.pop(request_id, None)
        optuna = import_optuna()
        states = optuna.trial.TrialState
        number = self._numbers[request_id]
        with quiet():
            if state == "completed":
                self.study.tell(number, metric, skip_if_finished=True)
            elif state == "stopped":
                self.study.tell(number, state=states.PRUNED, skip_if_finished=True)
            else:
                self.study.tell(number, state=states.FAIL, skip_if_finished=True)

    def _extra_state(self) -> dict[str, Any]:
        return {"optuna_trials": [[rid, number] for rid, number in self._numbers.items()],
                "sampler": self._sampler_name, "pruner": self._pruner}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        if (state.get("sampler"), state.get("pruner")) != (self._sampler_name, self._pruner):
            raise ValueError(f"the saved optuna search used sampler {state.get('sampler')!r} and pruner "
                             f"{state.get('pruner')!r}, the config asks for {self._sampler_name!r} and "
                             f"{self._pruner!r}; continue the experiment with the config it was created with")
        self._numbers = {int(rid): int(number) for rid, number in state["optuna_trials"]}
        self._reconcile()

    # -- internals --------------------------------------------------------------------------------
    def _reconcile(self) -> None:
        """Match the study to the saved state after the runner was killed: trials asked after the state was
        saved were never run (FAIL them); trials told after it keep Optuna's record (their replayed reports
        change nothing there)."""
        if self._numbers and self._study_path is not None and not self._study_path.is_file():
            raise ValueError(f"the optuna study {self._study_path} of this experiment is missing; it cannot "
                             "continue without it")
        optuna = import_optuna()
        running = optuna.trial.TrialState.RUNNING
        ours_running = {self._numbers[rid]: rid for rid in self.running()}
        self._told_before = {}
        for frozen in self.study.get_trials(deepcopy=False):
            rid = ours_running.get(frozen.number)
            if frozen.state == running and rid is None:
                with quiet():
                    self.study.tell(frozen.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            elif rid is not None and frozen.state != running:
                self._told_before[rid] = frozen.state.name
            elif rid is not None and any(step >= self.next_length(rid) for step in frozen.intermediate_values):
                self._told_before[rid] = "RUNNING"  # promoted at this rung before the kill

    def _live_trial(self, request_id: int) -> Any:
        """The optuna.Trial of a running request (rebuilt from the study after a restart of the runner)."""
        if request_id not in self._live:
            optuna = import_optuna()
            frozen = self.study.get_trials(deepcopy=False)[self._numbers[request_id]]
            self._live[request_id] = optuna.trial.Trial(self.study, frozen._trial_id)
        return self._live[request_id]
