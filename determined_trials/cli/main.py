"""The ``det-trials`` entry point: builds the argument parser from the command groups and runs one command.

To add a command group, write a module with ``register(commands)`` and list it in ``_GROUPS``.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from determined_trials import __version__
from determined_trials.cli import _checkpoint, _common, _experiment, _manage, _run, _tensorboard, _trial, _ui
from determined_trials.core.store import NotFoundError

__all__ = ["build_parser", "main"]

_GROUPS = (_experiment, _trial, _checkpoint, _run, _manage, _tensorboard, _ui)  # _run, _manage extend the first three


def build_parser() -> argparse.ArgumentParser:
    """The full ``det-trials`` parser."""
    parser = argparse.ArgumentParser(
        prog="det-trials",
        description="Run and inspect local determined_trials experiments: trials, metrics, checkpoints.",
    )
    parser.add_argument(
        "--run-dir",
        metavar="DIR",
        default=None,
        help=f"the run dir (default: ${_common.RUN_DIR_ENV}, else ./{_common.DEFAULT_RUN_DIR})",
    )
    parser.add_argument("--version", action="version", version=f"det-trials {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in _GROUPS:
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``det-trials`` with ``argv`` (default: the process's arguments); return the exit code.

    Exit codes: 0 success, 2 bad usage, missing run dir/store or unknown id.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on usage errors (2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _config_warnings_as_lines(warnings.showwarning)
            return int(args.handler(args))
    except (_common.CliError, NotFoundError) as exc:
        print(f"det-trials: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`det-trials ... | head`); stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _config_warnings_as_lines(show: Any) -> Any:
    """A ``warnings.showwarning`` that prints a config warning as one line of ours (where in our code it
    was raised means nothing to a user) and hands any other warning to ``show``."""
    from determined_trials.config import ConfigWarning

    def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: TextIO | None = None, line: str | None = None) -> None:
        if issubclass(category, ConfigWarning):
            print(f"det-trials: warning: {message}", file=file or sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning


if __name__ == "__main__":
    sys.exit(main())
