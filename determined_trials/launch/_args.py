"""Launcher command lines: ``[OPTIONS] [OVERRIDES... --] (--trial SPEC | SCRIPT [ARGS...])``, where
OPTIONS are ours, OVERRIDES go to the engine's launcher, and whatever follows belongs to the script."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Sequence

__all__ = ["LEGACY_ENTRYPOINT", "LaunchArgs", "LaunchError", "entrypoint_command", "parse"]

LEGACY_ENTRYPOINT = re.compile(r"^[A-Za-z0-9_.]+:[A-Za-z0-9_]+$")  # `model_def:MyTrial`
_OWN = {"--config": "config", "--context-dir": "context_dir", "--latest-checkpoint": "latest_checkpoint",
        "--fail-grace": "fail_grace"}
_EXAMPLE = "--trial model_def.py:MyTrial"


class LaunchError(Exception):
    """A usage, config or environment problem; the launcher prints it and exits 2."""


@dataclasses.dataclass
class LaunchArgs:
    """A parsed launcher command line."""

    config: str | None = None
    context_dir: str | None = None
    latest_checkpoint: str | None = None
    fail_grace: float = 3.0
    overrides: list[str] = dataclasses.field(default_factory=list)
    trial: str | None = None
    script: list[str] = dataclasses.field(default_factory=list)
    help: bool = False


def _take_options(args: list[str], out: LaunchArgs) -> list[str]:
    """Consume our options at the front of ``args``; return the rest."""
    while args:
        if args[0] in ("-h", "--help"):
            out.help = True
            return []
        name, eq, value = args[0].partition("=")
        if name not in _OWN:
            return args
        if eq:
            args = args[1:]
        elif len(args) < 2 or args[1] == "--":
            raise LaunchError(f"{name} needs a value")
        else:
            value, args = args[1], args[2:]
        if name == "--fail-grace":
            try:
                out.fail_grace = float(value)
            except ValueError:
                raise LaunchError(f"--fail-grace takes seconds, got {value!r}") from None
        else:
            setattr(out, _OWN[name], value)
    return args


def _split_overrides(args: list[str], out: LaunchArgs, engine: str) -> list[str]:
    if not args or not args[0].startswith("-") or args[0] == "--trial" or args[0].startswith("--trial="):
        return args
    if args[0] == "--":
        return args[1:]
    if "--" not in args:
        raise LaunchError(f"{args[0]!r} looks like a {engine} option: end {engine} options with `--`, "
                          f"e.g. `{args[0]} ... -- {_EXAMPLE}`")
    cut = args.index("--")
    out.overrides = args[:cut]
    misplaced = [a for a in out.overrides if a.partition("=")[0] in _OWN]
    if misplaced:
        raise LaunchError(f"{misplaced[0]} is an option of this launcher: put it first, before the overrides")
    return args[cut + 1 :]


def _take_target(args: list[str], out: LaunchArgs) -> None:
    if not args:
        raise LaunchError(f"empty script is not allowed: give {_EXAMPLE} or SCRIPT [ARGS...]")
    head = args[0]
    if head == "--trial" or head.startswith("--trial="):
        if "=" in head:
            spec, rest = head.partition("=")[2], args[1:]
        else:
            spec, rest = (args[1] if len(args) > 1 else ""), args[2:]
        if rest:
            raise LaunchError(f"extra arguments to --trial: {' '.join(rest)} (a trial takes none; put settings "
                              "in the config's hyperparameters or data section)")
        out.trial = spec
    elif head.startswith("-"):
        raise LaunchError(f"unrecognized argument {head!r}; expected {_EXAMPLE} or SCRIPT [ARGS...]")
    elif len(args) == 1 and LEGACY_ENTRYPOINT.match(head) and not head.endswith(".py"):
        out.trial = head  # the legacy `entrypoint: model_def:MyTrial` form
    else:
        out.script = list(args)


def parse(argv: Sequence[str], engine: str = "torchrun") -> LaunchArgs:
    """Parse a launcher command line (``engine``: whose overrides, for messages); ``LaunchError`` says
    what is wrong."""
    out = LaunchArgs()
    rest = _take_options(list(argv), out)
    if out.help:
        return out
    rest = _split_overrides(rest, out, engine)
    rest = _take_options(rest, out)
    if not out.help:
        _take_target(rest, out)
    return out


def entrypoint_command(entrypoint: str | Sequence[str], python: str | None = None) -> list[str]:
    """The command for a config's ``entrypoint``: the legacy ``model_def:MyTrial`` runs under the
    torch_distributed launcher, another string through ``sh -c``, a list as it is."""
    if not isinstance(entrypoint, str):
        return list(entrypoint)
    text = entrypoint.strip()
    if LEGACY_ENTRYPOINT.match(text):
        return [python or sys.executable, "-m", "determined_trials.launch.torch_distributed", "--", "--trial", text]
    return ["sh", "-c", entrypoint]
