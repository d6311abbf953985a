"""Helpers shipped for users' own tests: run a function as the ranks of a job in real processes.

May import: errors, core.*, loop
"""

from determined_trials.testing._ranks import RanksFailed, free_port, run_ranks

__all__ = ["RanksFailed", "free_port", "run_ranks"]
