"""The exceptions users see: invalid hyperparameters, bad configuration, failed collectives.

May import: nothing
"""

__all__ = ["PREEMPTED_EXIT_CODE", "CollectiveError", "ConfigError", "InvalidHP", "TrainingInterrupted"]

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: stopped by a preemption, resumable from its checkpoint


class InvalidHP(Exception):
    """Raise inside a trial to end it early because its hyperparameters cannot work.

    The trial is recorded as exited early (reason INVALID_HP); the experiment goes on.
    """


class ConfigError(ValueError):
    """An experiment configuration (or another user input) that cannot be used as given."""


class CollectiveError(RuntimeError):
    """A collective (gather, broadcast, ...) could not complete: a peer died, hung or diverged."""


class TrainingInterrupted(SystemExit):
    """Raised by ``Trainer.fit`` in a plain script after Ctrl-C stopped training with a checkpoint.

    A script that lets it through exits with status 75 ("preempted, resumable") and no traceback;
    the trial is recorded as PAUSED, not as an error.
    """

    def __init__(self) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
