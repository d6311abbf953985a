"""Checks at ``experiment create`` that need no training: the entrypoint's trial class imports (in a
short child process, so that the user's imports never run in the runner), exists, is a trial class,
and the hyperparameters hold ``global_batch_size`` where its family needs it.

Run as ``python -m determined_trials.experiment._preflight SPEC CONTEXT_DIR``: prints the class's
trial family, or the error on stderr with exit status 2.
"""

from __future__ import annotations

import inspect
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from determined_trials.errors import ConfigError

__all__ = ["PREFLIGHT_TIMEOUT_S", "PreflightError", "check_entrypoint", "trial_spec_of"]

PREFLIGHT_TIMEOUT_S = 300.0
_NEEDS_GLOBAL_BATCH_SIZE = ("PyTorchTrial", "TFKerasTrial")


class PreflightError(Exception):
    """The experiment can never run as configured; the message says what to fix."""


def trial_spec_of(entrypoint: str | list[str] | tuple[str, ...] | None) -> tuple[str, str | None] | None:
    """(``--trial`` spec, ``--context-dir`` or None) when the entrypoint runs a trial class, else None."""
    from determined_trials.launch._args import LEGACY_ENTRYPOINT

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


def check_entrypoint(config: Any, model_dir: Path, timeout: float = PREFLIGHT_TIMEOUT_S) -> None:
    """Raise ``PreflightError``/``ConfigError`` when the entrypoint's trial class cannot run."""
    spec = trial_spec_of(config.entrypoint)
    if spec is None:
        return  # a script: nothing to check without running it
    text, context = spec
    context_dir = model_dir / context if context else model_dir
    cmd = [sys.executable, "-m", "determined_trials.experiment._preflight", text, str(context_dir)]
    try:
        done = subprocess.run(cmd, cwd=model_dir, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PreflightError(f"importing the entrypoint's trial {text!r} took more than {timeout:.0f} s; "
                             "does the module train or download at import time?") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        message = lines[-1] if lines else f"exit status {done.returncode}"
        raise PreflightError(f"the config's entrypoint cannot run: {message.removeprefix('error: ')}")
    family = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if family in _NEEDS_GLOBAL_BATCH_SIZE and "global_batch_size" not in config.hyperparameters:
        raise ConfigError(f"hyperparameters: a {family} needs `global_batch_size` (the batch size summed "
                          "over all processes); add e.g. `global_batch_size: 32` under hyperparameters")


def _main(argv: list[str]) -> int:
    from determined_trials.launch._trial_spec import TrialSpecError, import_trial_class, parse_trial_spec, trial_family

    text, context_dir = argv
    try:
        spec = parse_trial_spec(text, context_dir)
        cls = import_trial_class(spec)
    except TrialSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    family = trial_family(cls)
    if family is None:
        bases = ", ".join(base.__name__ for base in cls.__bases__)
        print(f"error: {text!r}: {cls.__name__} is not a trial class (its bases: {bases}); make it subclass "
              "det.pytorch.PyTorchTrial (or DeepSpeedTrial, TFKerasTrial)", file=sys.stderr)
        return 2
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        print(f"error: {text!r}: {cls.__name__} does not define {missing}; a {family} needs them", file=sys.stderr)
        return 2
    print(family)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
