"""``python -m determined_trials.launch.harness --trial FILEPATH:ClassName``: train one PyTorchTrial (or
TFKerasTrial or DeepSpeedTrial) on this process, with the experiment configuration's periods, under whatever
launcher started it.

Options: ``--config PATH`` (else ``$DET_EXPERIMENT_CONFIG``, else the launcher's cluster info),
``--context-dir DIR`` (where the trial file lives; default: the working directory),
``--latest-checkpoint UUID|latest`` (else ``$DET_LATEST_CHECKPOINT``, else the cluster info's).
A bare ``module:Class`` argument (the legacy entrypoint form) works like ``--trial``.
Exit status: 0 when training completed or the trial stopped itself; 75 after a preemption (0 under
a launcher, which reads the ``preempted`` marker); 2 for a spec or config problem (one message).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from determined_trials.launch._families import PYTORCH, TrialFamily, claimed_family, family_of
from determined_trials.launch._launch_dir import (
    PREEMPTED_EXIT_CODE,
    launch_dir,
    mark_preempted,
    mark_ready,
    write_failure,
)
from determined_trials.launch._trial_spec import TrialSpec, TrialSpecError, import_trial_class, parse_trial_spec

__all__ = ["CONFIG_ENV", "LATEST_CHECKPOINT_ENV", "load_pytorch_trial", "main", "resolve_latest_checkpoint"]

CONFIG_ENV = "DET_EXPERIMENT_CONFIG"
LATEST_CHECKPOINT_ENV = "DET_LATEST_CHECKPOINT"
USAGE_EXIT_CODE = 2
_PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
logger = logging.getLogger("determined_trials.launch")


class HarnessError(Exception):
    """A problem the user fixes in the command line, the config or the trial file (exit status 2)."""


class _EarlySignals:
    """Holds a preemption signal that arrives before the Core API listens (while torch imports), and
    hands it over afterwards; a second identical signal ends the process as usual."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self._active = True

    def install(self) -> None:
        for sig in _PREEMPT_SIGNALS:
            signal.signal(sig, self._handle)
        folder = launch_dir()
        if folder is not None:
            mark_ready(folder, os.getpid())

    def hand_over(self) -> None:
        """The Core API's handlers are installed now: deliver what arrived before, step aside."""
        self._active = False
        for signum in self.seen:
            os.kill(os.getpid(), signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._active and signum not in self.seen:
            self.seen.append(signum)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def load_pytorch_trial(spec_text: str, context_dir: str | os.PathLike[str] = ".") -> type:
    """The trial class (of any family in ``launch/_families``) a ``--trial`` spec names; ``TrialSpecError``
    with advice otherwise."""
    spec = parse_trial_spec(spec_text, context_dir)
    cls = import_trial_class(spec)
    _check_trial_class(cls, spec)
    return cls


def _check_trial_class(cls: type, spec: TrialSpec) -> None:
    family = claimed_family(cls)
    if family is None:
        bases = ", ".join(base.__name__ for base in cls.__bases__)
        raise TrialSpecError(f"--trial {spec.text!r}: {cls.__name__!r} in {spec.where} is not a trial class (its "
                             f"bases: {bases}); make it subclass det.pytorch.PyTorchTrial")
    if family is PYTORCH:
        _check_pytorch_trial(cls, spec, family)
    try:
        family.trial().check_trial_class(cls)
    except TypeError as exc:
        raise TrialSpecError(f"--trial {spec.text!r}: {exc}") from None


def _check_pytorch_trial(cls: type, spec: TrialSpec, family: TrialFamily) -> None:
    """What the harness says first of a PyTorchTrial: the methods it lacks, or a look-alike base class."""
    name = f"{cls.__name__!r} in {spec.where}"
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise TrialSpecError(f"--trial {spec.text!r}: {name} does not define {missing}; a PyTorchTrial needs them")
    if not issubclass(cls, family.base_class()):
        base = next(b for b in cls.__mro__ if b.__name__ == family.name)
        raise TrialSpecError(
            f"--trial {spec.text!r}: {name} subclasses {base.__module__}.PyTorchTrial, not this package's; "
            "import it with `from determined_trials import pytorch` (pytorch.PyTorchTrial)"
        )


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m determined_trials.launch.harness",
        description="Train a PyTorchTrial on this process (one rank of a launch).",
    )
    parser.add_argument("legacy_trial", nargs="?", metavar="module:Class", help="legacy form of --trial")
    parser.add_argument("--trial", help="FILEPATH:ClassName (or module:ClassName)")
    parser.add_argument("--config", help=f"experiment config file (default: ${CONFIG_ENV} or the cluster info)")
    parser.add_argument("--context-dir", default=".", help="folder the trial file is imported from (default: .)")
    parser.add_argument("--latest-checkpoint", help="checkpoint uuid to resume from, or 'latest'")
    args = parser.parse_args(argv)
    if args.trial is not None and args.legacy_trial is not None:
        parser.error(f"give the trial once: --trial {args.trial} or {args.legacy_trial}, not both")
    if args.trial is None and args.legacy_trial is None:
        parser.error("missing --trial FILEPATH:ClassName (e.g. --trial model_def.py:MyTrial)")
    args.trial = args.trial if args.trial is not None else args.legacy_trial
    return args


def _load_experiment_config(path: str | None) -> Any:
    from determined_trials._info import get_cluster_info
    from determined_trials.config import load_config
    from determined_trials.errors import ConfigError

    source: Any = path or os.environ.get(CONFIG_ENV)
    if not source:
        info = get_cluster_info()
        if info is None:
            raise HarnessError(
                f"no experiment configuration: pass --config PATH, set ${CONFIG_ENV} to a config file, or run "
                "under the local experiment runner"
            )
        source = info.trial.config
    try:
        return load_config(source)
    except (ConfigError, ValueError) as exc:
        raise HarnessError(str(exc)) from None


def resolve_latest_checkpoint(value: str | None) -> str | None:
    """A checkpoint uuid: ``value``, with 'latest' meaning the newest checkpoint in the run folder."""
    from determined_trials.core import LATEST, resolve_latest

    if value != LATEST:
        return value or None
    from determined_trials._info import get_cluster_info
    from determined_trials.core import LocalStore, resolve_run_dir

    store = LocalStore(resolve_run_dir(None, get_cluster_info()))
    try:
        uuid = resolve_latest(store)
    finally:
        store.close()
    if uuid is None:
        raise HarnessError(f"--latest-checkpoint latest: there is no checkpoint in {store.path} yet")
    return uuid


def _fit_arguments(config: Any, latest_checkpoint: str | None) -> dict[str, Any]:
    from determined_trials.loop import Batch, unit_from_length

    def period(length: Any) -> Any:
        return unit_from_length(length.value, length.unit) if length is not None and length.value > 0 else None

    return {
        "max_length": None,  # the searcher's operations decide
        "validation_period": period(config.min_validation_period),
        "checkpoint_period": period(config.min_checkpoint_period),
        "reporting_period": Batch(config.scheduling_unit),
        "checkpoint_policy": config.checkpoint_policy,
        "latest_checkpoint": latest_checkpoint,
        "step_zero_validation": config.perform_initial_validation,
        "profiling_enabled": config.profiling.enabled,
    }


def _configure_logging(debug: bool) -> None:
    """The chief logs INFO (DEBUG with ``debug: true``); other ranks WARNING and above, so a job's progress
    is said once, not once a rank (each rank still says that it started: ``_say_started``)."""
    rank = int(os.environ.get("RANK", "0") or 0)
    level = logging.WARNING if rank != 0 else logging.DEBUG if debug else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)


def _say_started(context: Any, trial_cls: type) -> None:
    """One line from every rank (whatever its log level) when its context is ready: which rank of how many,
    and the tf.distribute strategy where the family has one, so a user sees every rank came up."""
    dist = context.distributed
    strategy = getattr(context, "strategy", None)
    how = "" if strategy is None else (f" with {type(strategy).__name__}, "
                                       f"{getattr(strategy, 'num_replicas_in_sync', '?')} replicas in sync")
    print(f"det-trials: rank {dist.get_rank()} of {dist.get_size()} (local rank {dist.get_local_rank()}) "
          f"training {trial_cls.__name__}{how}", file=sys.stderr, flush=True)


def _train(trial_cls: type, config: Any, latest_checkpoint: str | None, early: _EarlySignals) -> int:
    from determined_trials.loop import ExitReason

    package = (family_of(trial_cls) or PYTORCH).entry()
    trainer = None
    with package.init(exp_conf=config) as context:  # swallows InvalidHP: the trial ends early, as a success
        early.hand_over()
        _say_started(context, trial_cls)
        trainer = package.Trainer(trial_cls(context), context)
        trainer.fit(**_fit_arguments(config, latest_checkpoint))
    exit_reason = None if trainer is None else trainer.exit_reason
    if exit_reason is not ExitReason.PREEMPTED:
        return 0
    folder = launch_dir()
    if folder is None:
        print("preempted, resumable: resume from the latest checkpoint", file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    mark_preempted(folder)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the harness command line (default: ``sys.argv[1:]``); returns the exit status."""
    early = _EarlySignals()
    early.install()
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = _load_experiment_config(args.config)
        _configure_logging(config.debug)
        latest = resolve_latest_checkpoint(args.latest_checkpoint or os.environ.get(LATEST_CHECKPOINT_ENV))
        trial_cls = load_pytorch_trial(args.trial, args.context_dir)
    except (HarnessError, TrialSpecError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_EXIT_CODE
    try:
        return _train(trial_cls, config, latest, early)
    except BaseException as exc:
        folder = launch_dir()
        if folder is not None and not (isinstance(exc, SystemExit) and not exc.code):
            write_failure(folder, int(os.environ.get("RANK", "0") or 0), f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    sys.exit(main())
