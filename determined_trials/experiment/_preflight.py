"""Checks at ``experiment create`` that need no training: a script entrypoint's program (and Python
script) exists; the entrypoint's trial class imports (in a short child process, so that the user's
imports never run in the runner), exists, is a trial class, and the hyperparameters hold
``global_batch_size`` where its family needs it.

Run as ``python -m determined_trials.experiment._preflight SPEC CONTEXT_DIR``: prints the class's
trial family, or the error on stderr with exit status 2.
"""

from __future__ import annotations

import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from determined_trials.errors import ConfigError

__all__ = [
    "PREFLIGHT_TIMEOUT_S", "PreflightError", "PreflightRun", "check_command", "check_entrypoint", "run_check",
    "trial_spec_of",
]

PreflightRun = Callable[[list[str], Path, float], "tuple[int, str, str] | None"]
"""Runs the check (``run_check``'s arguments, the folder, a timeout): (exit status, stdout, stderr), None when
it could not (then it runs as its own process); ``subprocess.TimeoutExpired`` past the timeout."""

PREFLIGHT_TIMEOUT_S = 300.0
_DOTTED_CLASS = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)\.([A-Za-z_][A-Za-z0-9_]*)$")  # `model_def.MyTrial`
_PYTHON = re.compile(r"^python[0-9.]*$")


class PreflightError(Exception):
    """The experiment can never run as configured; the message says what to fix."""


def trial_spec_of(entrypoint: str | list[str] | tuple[str, ...] | None) -> tuple[str, str | None] | None:
    """(``--trial`` spec, ``--context-dir`` or None) when the entrypoint runs a trial class, else None."""
    from determined_trials.launch import LEGACY_ENTRYPOINT

    if entrypoint is None:
        return None
    if isinstance(entrypoint, str):
        if LEGACY_ENTRYPOINT.match(entrypoint.strip()):
            return entrypoint.strip(), None
        try:
            words = shlex.split(entrypoint)
        except ValueError:
            return None
    else:
        words = [str(w) for w in entrypoint]
    found: dict[str, str] = {}
    for flag, value in zip(words, words[1:]):
        if flag in ("--trial", "--context-dir"):
            found.setdefault(flag, value)
    for word in words:
        for flag in ("--trial", "--context-dir"):
            if word.startswith(flag + "="):
                found.setdefault(flag, word.split("=", 1)[1])
    return (found["--trial"], found.get("--context-dir")) if "--trial" in found else None


def check_command(entrypoint: str | list[str] | tuple[str, ...] | None, context_dir: Path) -> None:
    """Raise ``PreflightError`` when a script entrypoint's program is neither a file in the context
    directory nor a command on PATH (``model_def.MyTrial`` gets the ``model_def:MyTrial`` hint), or
    when ``python3 SCRIPT.py`` names a script the context directory lacks."""
    from determined_trials.experiment._launch import trial_command

    if entrypoint is None or trial_spec_of(entrypoint) is not None or not context_dir.is_dir():
        return  # a trial class is checked by ``check_entrypoint``; a missing folder by the snapshot
    cmd = trial_command(entrypoint)
    if cmd[:2] == ["sh", "-c"] or not cmd:
        return  # shell syntax: the shell decides
    program = cmd[0]
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # as the trial's
    found = (context_dir / program).is_file() if "/" in program else shutil.which(program, path=search) is not None
    if not found:
        dotted = _DOTTED_CLASS.match(program) if len(cmd) == 1 else None
        hint = (f"; to run a trial class write `{dotted.group(1)}:{dotted.group(2)}` (module:Class)" if dotted
                else "; give a command on PATH or a file in the context directory, e.g. `python3 train.py`")
        raise PreflightError(f"the config's entrypoint {' '.join(cmd)!r} cannot run: {program!r} is neither a "
                             f"file in the context directory {context_dir} nor a command on PATH{hint}")
    script = cmd[1] if len(cmd) > 1 and _PYTHON.match(Path(program).name) and cmd[1].endswith(".py") else None
    if script is not None and not (context_dir / script).is_file():
        raise PreflightError(f"the config's entrypoint {' '.join(cmd)!r} cannot run: the context directory "
                             f"{context_dir} has no {script}")


def check_entrypoint(config: Any, model_dir: Path, timeout: float = PREFLIGHT_TIMEOUT_S,
                     run: PreflightRun | None = None) -> None:
    """Raise ``PreflightError``/``ConfigError`` when the entrypoint's trial class cannot run. ``run``: where the
    check runs (a warm parent's fork); by default, and when it cannot, a process of its own."""
    spec = trial_spec_of(config.entrypoint)
    if spec is None:
        return  # a script: nothing to check without running it
    text, context = spec
    args = [text, str(model_dir / context if context else model_dir)]
    try:
        done = run(args, model_dir, timeout) if run is not None else None
        if done is None:
            done = _run_process(args, model_dir, timeout)
    except subprocess.TimeoutExpired:
        raise PreflightError(f"importing the entrypoint's trial {text!r} took more than {timeout:.0f} s; "
                             "does the module train or download at import time?") from None
    code, stdout, stderr = done
    if code != 0:
        lines = [line for line in stderr.splitlines() if line.strip()]
        message = lines[-1] if lines else f"exit status {code}"
        raise PreflightError(f"the config's entrypoint cannot run: {message.removeprefix('error: ')}")
    from determined_trials.launch import family_named

    family = family_named(stdout.strip().splitlines()[-1] if stdout.strip() else "")
    if family is not None and family.needs_global_batch_size and "global_batch_size" not in config.hyperparameters:
        raise ConfigError(f"hyperparameters: a {family.name} needs `global_batch_size` (the batch size summed "
                          "over all processes); add e.g. `global_batch_size: 32` under hyperparameters")


def _run_process(args: list[str], cwd: Path, timeout: float) -> tuple[int, str, str]:
    cmd = [sys.executable, "-m", "determined_trials.experiment._preflight", *args]
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout, done.stderr


def run_check(argv: list[str]) -> int:
    """``SPEC CONTEXT_DIR``: print the trial class's family (exit status 0), or the error on stderr (2)."""
    from determined_trials.launch import TrialSpecError, claimed_family, import_trial_class, parse_trial_spec

    text, context_dir = argv
    try:
        spec = parse_trial_spec(text, context_dir)
        cls = import_trial_class(spec)
    except TrialSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    family = claimed_family(cls)
    if family is None:
        bases = ", ".join(base.__name__ for base in cls.__bases__)
        print(f"error: {text!r}: {cls.__name__} is not a trial class (its bases: {bases}); make it subclass "
              "det.pytorch.PyTorchTrial (or DeepSpeedTrial, TFKerasTrial)", file=sys.stderr)
        return 2
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        print(f"error: {text!r}: {cls.__name__} does not define {missing}; a {family.name} needs them", file=sys.stderr)
        return 2
    print(family.name)
    return 0


if __name__ == "__main__":
    sys.exit(run_check(sys.argv[1:]))
