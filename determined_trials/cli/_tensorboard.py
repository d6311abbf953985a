"""``det-trials tensorboard EXPERIMENT_ID``: serve an experiment's TensorBoard event files on
127.0.0.1 until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from determined_trials.cli import _common

__all__ = ["register", "tensorboard_command", "tensorboard_logdir"]

DEFAULT_PORT = 6006


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``tensorboard`` command."""
    parser = commands.add_parser("tensorboard", help="start TensorBoard on an experiment's event files",
                                 description="start TensorBoard on an experiment's event files")
    parser.add_argument("experiment_id", metavar="EXPERIMENT_ID", type=int, help="experiment id")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT}; 0 = any free)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--run-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.set_defaults(handler=_tensorboard)


def tensorboard_logdir(run_dir: Path, experiment_id: int) -> Path:
    """Where the experiment's trials write their event files (one folder per trial)."""
    return run_dir / "tensorboard" / f"experiment_{experiment_id}"


def tensorboard_command(logdir: Path, *, port: int, host: str) -> list[str]:
    """The TensorBoard command line for ``logdir``."""
    return [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", host,
            "--port", str(port)]


def _tensorboard(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    store.experiment(args.experiment_id)
    logdir = tensorboard_logdir(store.path, args.experiment_id)
    if not logdir.is_dir():
        raise _common.CliError(f"experiment {args.experiment_id} has no TensorBoard event files yet ({logdir})")
    cmd = tensorboard_command(logdir, port=args.port, host=args.host)
    print(f"TensorBoard on {logdir}: http://{args.host}:{args.port}/ (Ctrl-C stops it)", flush=True)
    proc = subprocess.Popen(cmd)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
