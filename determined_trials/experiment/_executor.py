"""Where trial processes run: the executor seam of the experiment runner and its default, the local
executor (one process per trial on this machine, writing straight into the run folder's store)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from determined_trials.experiment._launch import TrialLaunch, trial_command, trial_environment
from determined_trials.experiment._process import TrialProcess
from determined_trials.experiment._warm import WarmParents, warm_spec

__all__ = ["LocalExecutor", "TrialExecutor", "TrialHandle", "TrialJob"]


@dataclasses.dataclass(frozen=True)
class TrialJob:
    """Everything an executor needs to start one run of a trial."""

    launch: TrialLaunch
    entrypoint: Any
    slots: int
    run_dir: Path
    trial_dir: Path
    model_dir: Path
    config_path: Path
    log_path: Path
    echo: Callable[[str], None]
    gpus: tuple[str, ...] = ()
    wake: Callable[[], None] = lambda: None  # the runner's: the trial may have ended (poll it now, not later)

    @property
    def prefix(self) -> str:
        """What each line of the trial's output starts with."""
        return f"[trial {self.launch.trial_id}] "


class TrialHandle(Protocol):
    """A started trial, as the runner sees it (``TrialProcess`` is one)."""

    terminated: bool

    def poll(self) -> int | None:
        """The exit status once the trial ended (and its output was read), else None."""

    def wait(self, timeout: float | None = None) -> int:
        """Block until the trial ended; its exit status."""

    def terminate(self) -> None:
        """Ask the trial, once, to checkpoint and stop (exit status 75 or 0)."""

    def kill(self) -> None:
        """Stop the trial now (it resumes later from its latest checkpoint)."""

    def reason(self, code: int) -> str:
        """A failure reason for exit status ``code``, with the last lines of output."""


class TrialExecutor(Protocol):
    """Starts trials; ``prepare`` runs once before the first trial, ``close`` after the last."""

    def prepare(self, config: Any, storage: Any) -> None:
        """Refuse (raise) what cannot work here, before any trial runs."""

    def start(self, job: TrialJob) -> TrialHandle:
        """Start one run of a trial."""

    def close(self) -> None:
        """Release what the executor holds; idempotent."""


class LocalExecutor:
    """Each trial is a process on this machine (the default), forked from a warm parent that imported
    torch, this package and the model_def once (``_warm``), unless ``resources.warm_processes`` is false
    or the trial cannot start warm (then started cold, as a new interpreter)."""

    def __init__(self) -> None:
        self._warm: WarmParents | None = None

    def prepare(self, config: Any, storage: Any) -> None:
        """Nothing to check: the run folder and checkpoint storage are on this machine."""
        if config.resources.warm_processes and self._warm is None:
            self._warm = WarmParents(_warn)

    def start(self, job: TrialJob) -> TrialHandle:
        """Start the trial's process with its environment; its output goes to the terminal and its log."""
        extra = {"CUDA_VISIBLE_DEVICES": ",".join(job.gpus)} if job.gpus else None
        env = trial_environment(job.launch, run_dir=job.run_dir, info_path=job.trial_dir / "cluster_info.json",
                                config_path=job.config_path, extra=extra)
        spec = warm_spec(job.entrypoint, job.slots) if self._warm is not None else None
        child = None if spec is None or self._warm is None else self._warm.fork(
            spec, job.model_dir, env, job.log_path.parent, on_exit=job.wake)
        return TrialProcess(trial_command(job.entrypoint), env=env, cwd=job.model_dir, log_path=job.log_path,
                            prefix=job.prefix, echo=job.echo, child=child, on_output_end=job.wake)

    def close(self) -> None:
        """End the warm parents."""
        if self._warm is not None:
            self._warm.close()
            self._warm = None


def _warn(message: str) -> None:
    print(f"det-trials: warning: {message}", file=sys.stderr, flush=True)
