"""What a person reads while an experiment runs and after: trial output lines, a progress bar (only
on a terminal), and the final table of trials with their best searcher metric and best checkpoint."""

from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any, TextIO

from determined_trials.core.store import LocalStore, Trial, checkpoint_scores

__all__ = ["Display", "TrialSummary", "summarize_trials", "trials_table"]


class Display:
    """Thread-safe line output with an optional tqdm progress bar over the searcher's progress."""

    def __init__(self, out: TextIO | None = None, *, progress: bool | None = None, quiet: bool = False) -> None:
        self._out = out or sys.stdout
        self._lock = threading.Lock()
        self._quiet = quiet
        show = self._out.isatty() if progress is None else progress
        self._bar: Any = None
        if show and not quiet:
            from tqdm import tqdm

            self._bar = tqdm(total=100, desc="experiment", unit="%", file=sys.stderr, leave=False,
                             bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}]")

    def echo(self, line: str) -> None:
        """Print one line (a trial's output or a runner message) above the progress bar."""
        if self._quiet:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.write(line, file=self._out)
            else:
                self._out.write(line + "\n")
                self._out.flush()

    def update(self, fraction: float) -> None:
        """Move the progress bar to ``fraction`` (0..1) of the searcher's work."""
        if self._bar is None:
            return
        target = max(0, min(100, round(float(fraction) * 100)))
        with self._lock:
            if target != self._bar.n:
                self._bar.n = target
                self._bar.refresh()

    def close(self) -> None:
        """Remove the progress bar."""
        if self._bar is not None:
            with self._lock:
                self._bar.close()
                self._bar = None


@dataclasses.dataclass(frozen=True)
class TrialSummary:
    """One row of the final table."""

    trial_id: int
    hparams: dict[str, Any]
    state: str
    best_metric: float | None
    best_checkpoint: str | None
    restarts: int


def _best_metric(store: LocalStore, trial: Trial, metric: str, smaller: bool) -> float | None:
    values = [r.metrics.get(metric) for r in store.metrics(trial.id, "validation")]
    usable = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v]
    if not usable:
        return None
    return min(usable) if smaller else max(usable)


def summarize_trials(store: LocalStore, experiment_id: int, metric: str, smaller: bool) -> list[TrialSummary]:
    """Each trial's hparams, state, best searcher metric and best kept checkpoint (else its latest)."""
    rows = []
    for trial in store.trials(experiment_id):
        checkpoints = store.checkpoints(trial_id=trial.id)
        scores = checkpoint_scores(store, checkpoints, metric)
        ranked = sorted(scores, key=lambda u: scores[u] if smaller else -scores[u])
        best = ranked[0] if ranked else (checkpoints[-1].uuid if checkpoints else None)
        rows.append(TrialSummary(trial.id, trial.hparams, trial.state, _best_metric(store, trial, metric, smaller),
                                 best, trial.restarts))
    return rows


def trials_table(summaries: list[TrialSummary], metric: str, fit: int | None = None) -> str:
    """The final table as aligned text (hyperparameters cut to fit ``fit`` characters, when given)."""
    from determined_trials._format import Column, flat_hparams, table

    columns = [Column("id", "TRIAL"), Column("hparams", "HPARAMS"), Column("state", "STATE"),
               Column("restarts", "RESTARTS"), Column("metric", f"BEST {metric}"),
               Column("checkpoint", "BEST CHECKPOINT")]
    rows = [[s.trial_id, " ".join(flat_hparams(s.hparams)), s.state, s.restarts, s.best_metric, s.best_checkpoint]
            for s in summaries]
    return table(columns, rows, fit=fit, squeeze=("hparams",))
