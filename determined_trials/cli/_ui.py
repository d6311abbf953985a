"""``det-trials ui``: serve the local web dashboard over the run folder (docs/ui.md)."""

from __future__ import annotations

import argparse

from determined_trials.cli import _common

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``ui`` command."""
    help_text = "serve a web dashboard of the run dir's experiments (pause, continue, kill from the page)"
    parser = commands.add_parser("ui", help=help_text, description=help_text)
    parser.add_argument("--run-dir", metavar="DIR", default=argparse.SUPPRESS,
                        help=f"the run dir (default: ${_common.RUN_DIR_ENV}, else ./{_common.DEFAULT_RUN_DIR})")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this "
                        "machine only; any other needs --token)")
    parser.add_argument("--port", type=int, default=8080, help="port (default: 8080; 0 picks a free one)")
    parser.add_argument("--read-only", action="store_true", help="no actions: every POST is refused (403); "
                        "needs only read access (the token is made for this run, nothing is written)")
    parser.add_argument("--token", default=None, metavar="T",
                        help="the secret every request must bring, at least 16 characters, never stored (default: "
                        "the one kept in the run dir's ui_token, else a new one kept there; with --read-only a new "
                        "one for this run)")
    parser.add_argument("--no-token", action="store_true",
                        help="INSECURE: check no token, so every user and program of this machine can read the "
                        "dashboard and act on it (loopback hosts only)")
    parser.set_defaults(handler=_ui)


def _ui(args: argparse.Namespace) -> int:
    try:
        from determined_trials.ui import serve
    except ImportError as exc:
        raise _common.CliError(f"det-trials ui needs the ui extra ({exc}): pip install 'determined_trials[ui]'"
                               ) from None
    store = _common.open_store(args)  # a clear error for a missing run dir or store
    store.close()
    try:
        serve(store.path, host=args.host, port=args.port, token=args.token, no_token=args.no_token,
              read_only=args.read_only, say=lambda line: print(line, flush=True))
    except (ValueError, OSError) as exc:
        raise _common.CliError(str(exc)) from None
    except KeyboardInterrupt:
        pass
    return 0
