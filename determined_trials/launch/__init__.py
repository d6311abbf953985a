"""Launchers, run as ``python -m determined_trials.launch.<name>``: ``torch_distributed`` (torchrun),
``wrap_rank`` (per-rank output prefix) and ``harness`` (one rank of a ``--trial FILEPATH:Class``).

May import: errors, _info, _compat, _format, config, core.*, loop, _trial_context,
searcher, pytorch.*, deepspeed, keras, testing
"""

from determined_trials.launch._args import LEGACY_ENTRYPOINT, entrypoint_command
from determined_trials.launch._families import claimed_family, family_named
from determined_trials.launch._launch_dir import LAUNCH_DIR_ENV, PREEMPTED_EXIT_CODE
from determined_trials.launch._procs import die_with_parent, free_port
from determined_trials.launch._spawn import TF_WORKERS_ENV
from determined_trials.launch._supervise import FAILED_RANK_LINE
from determined_trials.launch._trial_spec import TrialSpecError, import_trial_class, keep_trial_class, parse_trial_spec

__all__ = [
    "FAILED_RANK_LINE",
    "LAUNCH_DIR_ENV",
    "PREEMPTED_EXIT_CODE",
    "TrialSpecError",
    "entrypoint_command",
    "LEGACY_ENTRYPOINT",
    "TF_WORKERS_ENV",
    "claimed_family",
    "die_with_parent",
    "family_named",
    "free_port",
    "import_trial_class",
    "keep_trial_class",
    "parse_trial_spec",
]
