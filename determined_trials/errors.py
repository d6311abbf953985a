"""The exceptions users see: invalid hyperparameters, bad configuration, failed collectives."""

__all__ = ["CollectiveError", "ConfigError", "InvalidHP"]


class InvalidHP(Exception):
    """Raise inside a trial to end it early because its hyperparameters cannot work.

    The trial is recorded as exited early (reason INVALID_HP); the experiment goes on.
    """


class ConfigError(ValueError):
    """An experiment configuration (or another user input) that cannot be used as given."""


class CollectiveError(RuntimeError):
    """A collective (gather, broadcast, ...) could not complete: a peer died, hung or diverged."""
