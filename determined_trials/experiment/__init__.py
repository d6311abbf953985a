"""Local experiments: ``det-trials experiment create`` / ``continue`` run a searcher's trials as
processes, with restarts, pause/continue, logs and checkpoint garbage collection.

Owns the set-up and checks at ``create``, the context snapshot, the runner, reports, tracebacks, control
from outside the runner, and where trials run (``_executor``: processes on this machine; ``ray/``: Ray).

May import: errors, _info, _compat, _format, config, core.*, loop, _trial_context,
searcher, pytorch.*, deepspeed, keras, testing, launch, experiment.ray
"""

from determined_trials.core.store import RetentionPolicy, collect_garbage, kept_checkpoints
from determined_trials.experiment._control import (
    CONTINUE_LOG,
    activate_experiment,
    kill_experiment,
    live_owner,
    pause_experiment,
)
from determined_trials.experiment._errors import ExperimentError
from determined_trials.experiment._executor import TrialHandle, TrialJob
from determined_trials.experiment._launch import TrialLaunch, trial_command, trial_environment
from determined_trials.experiment._process import TrialProcess
from determined_trials.experiment._report import Display, TrialSummary, summarize_trials, trials_table
from determined_trials.experiment._runner import ExperimentRunner
from determined_trials.experiment._runner_state import Work
from determined_trials.experiment._setup import (
    ExperimentResult,
    continue_experiment,
    create_experiment,
    fork_trial,
    parallelism,
    visible_gpus,
)
from determined_trials.experiment._snapshot import (
    DEFAULT_MAX_CONTEXT_BYTES,
    DETIGNORE,
    ContextTooLargeError,
    context_files,
    snapshot_context,
)

__all__ = [
    "DEFAULT_MAX_CONTEXT_BYTES",
    "DETIGNORE",
    "ContextTooLargeError",
    "Display",
    "ExperimentError",
    "ExperimentResult",
    "ExperimentRunner",
    "RetentionPolicy",
    "TrialSummary",
    "Work",
    "collect_garbage",
    "context_files",
    "continue_experiment",
    "create_experiment",
    "fork_trial",
    "kept_checkpoints",
    "parallelism",
    "snapshot_context",
    "summarize_trials",
    "trials_table",
    "visible_gpus",
    "CONTINUE_LOG",
    "TrialHandle",
    "TrialJob",
    "TrialLaunch",
    "TrialProcess",
    "activate_experiment",
    "kill_experiment",
    "live_owner",
    "pause_experiment",
    "trial_command",
    "trial_environment",
]
