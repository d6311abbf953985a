"""The experiment runner's own error: something the user fixes before an experiment can run."""

__all__ = ["ExperimentError"]


class ExperimentError(Exception):
    """A problem the user fixes (wrong state, missing entrypoint); the CLI prints it, exit 2."""
