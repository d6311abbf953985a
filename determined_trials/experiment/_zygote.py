"""The warm parent of a local experiment's trial processes (``main([FD])``, run by ``_warm``): it imports
torch, this package and the trial's model_def once, then forks one process per trial.

Run by ``_warm`` with one end of a ``SOCK_SEQPACKET`` socket pair as FD. It imports torch and this package
first (maybe while the experiment is set up), then waits for ``{"spec", "folder", "config"}`` (the trial spec,
the model folder, the experiment's config file, whose parse the trials reuse) with the log file's descriptor
attached, and imports the model_def. It says then, one JSON message,
``{"ready": [files]}`` (the model_def's files it imported from its folder, with their sha256) or
``{"cold": reason}`` (then it exits: the runner starts that trial family cold). Then each message it gets
is a trial to start, ``{"args", "env", "cwd"}`` with the write end of the trial's output pipe attached; it
answers ``{"pid": N}`` and, when that process ends, ``{"exit": N, "code": C}`` (``Popen.returncode``'s
meaning). It holds no thread, socket (but the pair), store connection or CUDA context, so a fork is safe;
a model_def whose import starts a thread (Python's or native: ``/proc/self/task``) makes it say ``cold``.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
import json
import os
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from determined_trials.experiment._zygote_fork import MAX_MESSAGE, send_message, serve_forks

__all__ = ["file_digest", "main"]

# What a PyTorchTrial imports lazily before its first batch (an optimizer's first step; the store's TensorBoard
# scalars, never TensorFlow), imported here too: none starts a thread.
_LAZY_IMPORTS = ("torch._dynamo", "tensorboard.compat.proto.event_pb2", "tensorboard.compat.proto.summary_pb2",
                 "tensorboard.summary.writer.record_writer")
# Libraries model_defs often import whose import starts native threads that are safe across a fork: scipy's
# OpenBLAS pool (OpenBLAS shuts its pool down before a fork and starts it again when next used) and the jemalloc
# background thread scikit-learn's import starts (jemalloc's fork hooks). Imported, when installed, before the
# threads are counted, so a model_def importing them still starts warm.
_FORK_SAFE_POOLS = ("scipy.linalg", "sklearn")


def file_digest(path: str) -> str:
    """The sha256 of a file's bytes ("" when it cannot be read)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _import_common() -> int:
    """Import what every trial imports (torch, this package, what a trial imports lazily), never from the
    runner's working directory (a trial imports from its model folder); the native threads that leaves (torch's,
    numpy's and the pools above reset themselves at a fork: allowed)."""
    here = [entry for entry in sys.path if entry in ("", ".")]
    for entry in here:
        sys.path.remove(entry)
    try:
        return _import_common_modules()
    finally:
        sys.path[:0] = here


def _import_common_modules() -> int:
    import torch  # noqa: F401 - the point: imported once, shared by every forked trial

    import determined_trials.config  # noqa: F401
    import determined_trials.launch.harness  # noqa: F401
    from determined_trials import pytorch  # noqa: F401

    for name in (*_LAZY_IMPORTS, *_FORK_SAFE_POOLS):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    return _native_threads()


def _warm_up(spec_text: str, folder: Path, config_path: str, base_threads: int) -> dict[str, Any]:
    """Import the model_def and read the experiment's config (its parse is reused while the file's text is the
    same); what to tell the runner."""
    import torch

    from determined_trials.config import load_config
    from determined_trials.launch import keep_trial_class, parse_trial_spec

    before = set(sys.modules)
    try:
        keep_trial_class(parse_trial_spec(spec_text, folder))
    except BaseException as exc:  # noqa: BLE001 - the trial shows its own import error, cold
        return {"cold": f"importing {spec_text} failed ({type(exc).__name__}); its trials start cold"}
    with contextlib.suppress(Exception):  # a config the trial cannot read says so in the trial, cold or warm
        load_config(config_path)
    if torch.cuda.is_initialized():
        return {"cold": f"importing {spec_text} initializes CUDA, which a fork cannot copy; its trials start cold"}
    if threading.active_count() > 1 or _native_threads() > base_threads:
        return {"cold": f"importing {spec_text} starts a thread, which a fork cannot copy; its trials start "
                        "cold (`resources: {warm_processes: false}` skips the attempt)"}
    inside = str(folder.resolve()) + os.sep
    imported = [getattr(module, "__file__", None) for name, module in list(sys.modules.items()) if name not in before]
    paths = {str(Path(f).resolve()) for f in imported if isinstance(f, str) and os.path.isabs(f)}
    return {"ready": [[path, file_digest(path)] for path in sorted(p for p in paths if p.startswith(inside))]}


def _begin(sock: socket.socket) -> dict[str, Any] | None:
    """The runner's first message, ``{"spec", "folder", "config"}`` with the log file's descriptor attached:
    the output goes there from now on and the folder is the working directory; None if the runner closed.
    Before it, preflights: ``{"preflight": ARGS, "cwd"}`` with two files attached (stdout, stderr), answered
    ``{"code": C}`` once a forked child ran ``experiment._preflight`` on ARGS there."""
    while True:
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
        if not data:
            return None
        request: dict[str, Any] = json.loads(data)
        if "preflight" in request:
            send_message(sock, {"code": _preflight(request, fds)})
            continue
        for fd in (1, 2):
            os.dup2(fds[0], fd)
        os.close(fds[0])
        os.chdir(request["folder"])
        return request


def _preflight(request: dict[str, Any], fds: list[int]) -> int:
    """Run the preflight check in a forked child (the model_def's import stays out of this process); its
    exit status."""
    from determined_trials.launch import die_with_parent

    preexec = die_with_parent(signal.SIGKILL)  # a runner that gave up on it (its timeout) ends it with this parent
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            preexec()
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            os.chdir(request["cwd"])
            from determined_trials.experiment._preflight import run_check

            code = run_check(request["preflight"])
        except BaseException:  # noqa: BLE001 - said on its stderr, as the separate process would
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    for fd in fds:
        os.close(fd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def main(argv: list[str]) -> int:
    """``FD``: import torch and this package, then take the trial spec, model folder and config from the runner,
    import the model_def, tell the runner, serve forks until it closes the socket."""
    sock = socket.socket(fileno=int(argv[0]))
    base_threads = _import_common()  # while the runner sets the experiment up, maybe
    gc.freeze()  # what is imported stays: a collection (~0.2 s with torch's objects) never walks it again
    gc.enable()  # off while importing (``_warm`` starts it so)
    request = _begin(sock)
    if request is not None:
        state = _warm_up(request["spec"], Path.cwd(), request["config"], base_threads)
        send_message(sock, state)
        if "ready" in state:
            serve_forks(sock)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing of its own to clean up: skip torch's teardown at exit (~1.4 s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
