"""The optuna study as JSON in the runner's saved state, its one durable record (the study itself lives in memory
and is rebuilt from the record when the runner continues), and the parameter importances read from a record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from determined_trials.errors import ConfigError
from determined_trials.searcher._optuna_study import import_optuna, open_study, quiet

__all__ = ["MIN_TRIALS_FOR_IMPORTANCES", "StudyRecorder", "param_importances", "restore_study"]

MIN_TRIALS_FOR_IMPORTANCES = 10


def _trial_part(frozen: Any) -> dict[str, Any]:
    """One trial: its state, values, params in their distributions' internal form (numbers), intermediate values
    as [step, value] pairs and the system attributes a sampler keeps on it (CMA-ES's optimizer, for one)."""
    return {
        "state": frozen.state.name,
        "values": None if frozen.values is None else [float(v) for v in frozen.values],
        "params": {name: frozen.distributions[name].to_internal_repr(value) for name, value in frozen.params.items()},
        "intermediate": [[int(step), float(value)] for step, value in sorted(frozen.intermediate_values.items())],
        "system_attrs": dict(frozen.system_attrs),
    }


def _frozen_trial(part: Mapping[str, Any], distributions: Mapping[str, Any]) -> Any:
    """The `FrozenTrial` a part was made from (numbered by the study it is added to, in order)."""
    optuna = import_optuna()
    used = {name: distributions[name] for name in part["params"]}
    return optuna.trial.create_trial(
        state=optuna.trial.TrialState[part["state"]], values=part["values"],
        params={name: used[name].to_external_repr(value) for name, value in part["params"].items()},
        distributions=used, system_attrs=dict(part["system_attrs"]),
        intermediate_values={int(step): float(value) for step, value in part["intermediate"]},
    )


class StudyRecorder:
    """Makes the record of a study over `distributions`; a finished trial's part is made once and kept (it no
    longer changes), so a record at 200 trials costs little more than one of its running trials."""

    def __init__(self, distributions: Mapping[str, Any]) -> None:
        from optuna.distributions import distribution_to_json

        self._distributions = {name: distribution_to_json(d) for name, d in distributions.items()}
        self._finished: dict[int, dict[str, Any]] = {}

    def record(self, study: Any) -> dict[str, Any]:
        """The study's direction, distributions (Optuna's JSON), study-level system attributes (QMC's position
        in its sequence) and every trial in number order."""
        trials = []
        for frozen in study.get_trials(deepcopy=False):
            part = self._finished.get(frozen.number)
            if part is None:
                part = _trial_part(frozen)
                if frozen.state.is_finished():
                    self._finished[frozen.number] = part
            trials.append(part)
        system_attrs = study._storage.get_study_system_attrs(study._study_id)  # no public reader in Optuna 5
        return {"direction": study.direction.name, "distributions": dict(self._distributions),
                "system_attrs": dict(system_attrs), "trials": trials}

    def remember(self, record: Mapping[str, Any]) -> None:
        """Keep the finished trials' parts of a record the study was rebuilt from."""
        finished = {"COMPLETE", "PRUNED", "FAIL"}
        self._finished = {n: dict(part) for n, part in enumerate(record["trials"]) if part["state"] in finished}


def restore_study(record: Mapping[str, Any], *, sampler: Any = None, median_pruner: bool = False) -> Any:
    """A study in memory holding what `record` holds: its trials re-added in order (so with the same numbers),
    running ones still running."""
    optuna = import_optuna()
    distributions = {name: optuna.distributions.json_to_distribution(text)
                     for name, text in record["distributions"].items()}
    study = open_study(smaller_is_better=record["direction"] == "MINIMIZE", median_pruner=median_pruner,
                       sampler=sampler, system_attrs=dict(record["system_attrs"]))
    with quiet():
        study.add_trials([_frozen_trial(part, distributions) for part in record["trials"]])
    return study


def param_importances(record: Mapping[str, Any]) -> dict[str, float] | None:
    """Optuna's `get_param_importances` (its default evaluator) of the study in `record` (name -> share, largest
    first), or None before `MIN_TRIALS_FOR_IMPORTANCES` trials completed or without optuna."""
    completed = [part for part in record["trials"] if part["state"] == "COMPLETE"]
    if len(completed) < MIN_TRIALS_FOR_IMPORTANCES:
        return None
    try:
        optuna = import_optuna()
    except ConfigError:
        return None
    study = restore_study({**record, "trials": completed})
    with quiet():
        importances = optuna.importance.get_param_importances(study)
    return {name: float(value) for name, value in importances.items()}
