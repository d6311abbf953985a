"""Shared plumbing for ``det-trials`` commands: the run dir, opening the store, output options."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from determined_trials.core.store import LocalStore

__all__ = [
    "DEFAULT_RUN_DIR",
    "RUN_DIR_ENV",
    "CliError",
    "Handler",
    "add_command",
    "add_group",
    "add_output_options",
    "open_store",
    "output_format",
    "run_dir",
    "table_width",
]

RUN_DIR_ENV = "DET_RUN_DIR"
DEFAULT_RUN_DIR = "det-runs"

Handler = Callable[[argparse.Namespace], int]
_ALIASES = {"experiment": ["e"], "trial": ["t"], "checkpoint": ["c"]}  # as Determined's `det e list`


class CliError(Exception):
    """A problem the user can fix (bad id, missing run dir): printed without a traceback, exit 2."""


def run_dir(args: argparse.Namespace) -> Path:
    """The run dir: ``--run-dir``, else ``$DET_RUN_DIR``, else ``./det-runs``."""
    chosen = getattr(args, "run_dir", None) or os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR
    return Path(chosen)


def open_store(args: argparse.Namespace, *, create: bool = False) -> LocalStore:
    """Open the run dir's store; a missing run dir or store is a :class:`CliError` (unless ``create``)."""
    try:
        return LocalStore(run_dir(args), create=create)
    except (FileNotFoundError, RuntimeError) as exc:
        raise CliError(str(exc)) from None


def _run_dir_parent() -> argparse.ArgumentParser:
    """``--run-dir`` accepted after the subcommand too, without overriding an earlier value."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--run-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parent


def add_group(
    commands: argparse._SubParsersAction,
    name: str,
    help_text: str,
) -> argparse._SubParsersAction:
    """Add a command group (``experiment``, ``trial``, ...) whose subcommands come from ``add_command``."""
    parser = commands.add_parser(name, help=help_text, description=help_text, aliases=_ALIASES.get(name, []))
    return parser.add_subparsers(dest=f"{name}_command", metavar="COMMAND", required=True)


def add_command(
    group: argparse._SubParsersAction,
    name: str,
    handler: Handler,
    help_text: str,
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` to a command group; ``handler(args) -> exit code`` runs it."""
    parser: argparse.ArgumentParser = group.add_parser(
        name, help=help_text, description=help_text, parents=[_run_dir_parent()]
    )
    parser.set_defaults(handler=handler)
    return parser


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--csv`` / ``--json`` (a text table when neither is given) and ``--wide``."""
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--csv", dest="fmt", action="store_const", const="csv", help="print CSV")
    choice.add_argument("--json", dest="fmt", action="store_const", const="json", help="print JSON")
    parser.add_argument("--wide", action="store_true",
                        help="print every table cell whole (by default long ones are cut to fit the terminal)")
    parser.set_defaults(fmt="table")


def table_width(args: argparse.Namespace) -> int | None:
    """The width a text table is fitted to on a terminal (``$COLUMNS`` or the terminal's own); None
    (nothing cut) with ``--wide`` or when the output goes to a file or a pipe."""
    if getattr(args, "wide", False) or not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def output_format(args: argparse.Namespace) -> str:
    """The chosen output format: "table", "csv" or "json"."""
    return str(getattr(args, "fmt", "table") or "table")
