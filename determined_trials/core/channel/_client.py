"""The store channel's trial side: ``RemoteStore`` implements the ``TrialStore`` contract by forwarding each call
to the runner's ``StoreChannelServer``; ``open_store`` picks it when the runner handed the trial a channel token."""

from __future__ import annotations

import enum
import os
import pickle
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from determined_trials.core.channel._server import LOG_METHOD, ChannelToken
from determined_trials.core.store import (
    TRIAL_STORE_METHODS,
    CheckpointRecord,
    Experiment,
    LocalStore,
    MetricRecord,
    NotFoundError,
    SearcherOpRecord,
    Trial,
    TrialStore,
    dumps,
)

__all__ = ["STORE_CHANNEL_ENV", "ChannelError", "RemoteStore", "open_store", "own_store"]

STORE_CHANNEL_ENV = "DET_STORE_CHANNEL"
_TIMEOUT_S = float(os.environ.get("DET_STORE_CHANNEL_TIMEOUT", "120"))
_ERRORS: dict[str, type[Exception]] = {"NotFoundError": NotFoundError, "ValueError": ValueError, "TypeError": TypeError}


class ChannelError(RuntimeError):
    """The runner's store channel did not answer (runner gone, network down, or a wrong token)."""


def _plain(value: Any) -> Any:
    """Enum members as their values, paths as text (what the store itself would accept)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


class RemoteStore:
    """The ``TrialStore`` calls, run on the runner's store over the network (``LocalStore`` documents each).

    Each call is one request and one reply; a call without a reply within the timeout raises
    :class:`ChannelError` (nothing is retried, so nothing is recorded twice).
    """

    def __init__(self, token: ChannelToken, run_dir: str | os.PathLike[str], *, timeout_s: float = _TIMEOUT_S) -> None:
        self.token = token
        self.path = Path(run_dir)
        self._timeout_ms = int(timeout_s * 1000)
        self._lock = threading.Lock()
        self._pid = -1
        self._socket: zmq.Socket[bytes] | None = None

    def __repr__(self) -> str:
        return f"RemoteStore({self.token.address!r})"

    def _connected(self) -> zmq.Socket[bytes]:
        if self._pid != os.getpid() or self._socket is None:  # a forked child opens its own socket
            self._lock = threading.Lock()
            socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.REQ)
            socket.curve_serverkey = self.token.server_public.encode()
            socket.curve_publickey = self.token.client_public.encode()
            socket.curve_secretkey = self.token.client_secret.encode()
            socket.rcvtimeo = socket.sndtimeo = self._timeout_ms
            socket.linger = 0
            socket.connect(self.token.address)
            self._socket, self._pid = socket, os.getpid()
        return self._socket

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on the runner's store and return its result (or raise its error)."""
        body = dumps({"m": method, "a": [_plain(a) for a in args],
                      "kw": {k: _plain(v) for k, v in kwargs.items()}}, f"the arguments of {method}").encode()
        with self._lock:
            socket = self._connected()
            try:
                socket.send(body)
                reply = socket.recv()
            except zmq.Again:
                socket.close(linger=0)
                self._socket = None
                raise ChannelError(
                    f"the experiment runner's store at {self.token.address} did not answer {method} within "
                    f"{self._timeout_ms / 1000:.0f} s: the runner stopped, the network is down, or this "
                    "process's channel token is not the experiment's") from None
        answer = pickle.loads(reply)  # from the server this token authenticates (CURVE)
        if answer[0] == "ok":
            return answer[1]
        raise _ERRORS.get(answer[1], RuntimeError)(answer[2])

    def send_log(self, trial_id: int, lines: list[str]) -> None:
        """Hand lines of the trial's output to the runner (terminal and trial log)."""
        self.call(LOG_METHOD, trial_id=trial_id, lines=lines)

    def close(self) -> None:
        """Close this process's socket (reopened by the next call)."""
        with self._lock:
            if self._socket is not None and self._pid == os.getpid():
                self._socket.close(linger=0)
            self._socket = None

    # -- the TrialStore contract: each method is one call of the runner's store ---------------------
    def set_trial_state(self, trial_id: int, state: str, reason: str | None = None) -> None:
        self.call("set_trial_state", trial_id, state, reason)

    def set_trial_status(self, trial_id: int, status: str) -> None:
        self.call("set_trial_status", trial_id, status)

    def set_trial_progress(self, trial_id: int, progress: float) -> None:
        self.call("set_trial_progress", trial_id, progress)

    def set_trial_metadata(self, trial_id: int, metadata: dict[str, Any]) -> None:
        self.call("set_trial_metadata", trial_id, metadata)

    def set_trial_early_exit(self, trial_id: int, reason: str) -> None:
        self.call("set_trial_early_exit", trial_id, reason)

    def record_searcher_op(self, trial_id: int, length: int, metric: float | None, completed: bool) -> None:
        self.call("record_searcher_op", trial_id, length, metric, completed)

    def add_metrics(self, *, trial_id: int, group: str, steps_completed: int, metrics: dict[str, Any],
                    batch_metrics: list[dict[str, Any]] | None = None) -> None:
        self.call("add_metrics", trial_id=trial_id, group=group, steps_completed=steps_completed, metrics=metrics,
                  batch_metrics=batch_metrics)

    def add_metrics_reports(self, *, trial_id: int, reports: Sequence[dict[str, Any]]) -> None:
        self.call("add_metrics_reports", trial_id=trial_id, reports=reports)

    def supersede_metrics_after(self, trial_id: int, steps_completed: int | None) -> int:
        return self.call("supersede_metrics_after", trial_id, steps_completed)

    def add_checkpoint(self, *, uuid: str, trial_id: int | None, steps_completed: int, metadata: dict[str, Any],
                       resources: dict[str, int], storage: str, pending: bool = False) -> None:
        self.call("add_checkpoint", uuid=uuid, trial_id=trial_id, steps_completed=steps_completed,
                  metadata=metadata, resources=resources, storage=storage, pending=pending)

    def pending_checkpoints(self, trial_id: int) -> list[str]:
        return self.call("pending_checkpoints", trial_id)

    def drop_pending_checkpoint(self, uuid: str) -> None:
        self.call("drop_pending_checkpoint", uuid)

    def mark_checkpoint_deleted(self, uuid: str) -> None:
        self.call("mark_checkpoint_deleted", uuid)

    def add_trial_time(self, trial_id: int, parts: Mapping[str, float], batches_reached: int | None = None) -> None:
        self.call("add_trial_time", trial_id, parts, batches_reached)

    def experiment(self, experiment_id: int) -> Experiment:
        return self.call("experiment", experiment_id)

    def trial(self, trial_id: int) -> Trial:
        return self.call("trial", trial_id)

    def get_trial_metadata(self, trial_id: int) -> dict[str, Any]:
        return self.call("get_trial_metadata", trial_id)

    def metrics(self, trial_id: int, group: str | None = None, *,
                include_superseded: bool = False) -> list[MetricRecord]:
        return self.call("metrics", trial_id, group, include_superseded=include_superseded)

    def searcher_ops(self, trial_id: int) -> list[SearcherOpRecord]:
        return self.call("searcher_ops", trial_id)

    def best_validation(self, experiment_id: int, metric: str, smaller_is_better: bool) -> float | None:
        return self.call("best_validation", experiment_id, metric, smaller_is_better)

    def checkpoints(self, *, trial_id: int | None = None, experiment_id: int | None = None,
                    include_deleted: bool = False) -> list[CheckpointRecord]:
        return self.call("checkpoints", trial_id=trial_id, experiment_id=experiment_id,
                         include_deleted=include_deleted)

    def latest_checkpoint(self, trial_id: int) -> CheckpointRecord | None:
        return self.call("latest_checkpoint", trial_id)

    def batches_reached(self, trial_id: int) -> int:
        return self.call("batches_reached", trial_id)

    def tracker_run(self, trial_id: int, tracker: str) -> dict[str, Any] | None:
        return self.call("tracker_run", trial_id, tracker)

    def set_tracker_run(self, trial_id: int, tracker: str, run_id: str, url: str | None = None) -> None:
        self.call("set_tracker_run", trial_id, tracker, run_id, url)

    def set_tracker_forwarded(self, trial_id: int, tracker: str, metric_id: int,
                              progress: dict[str, Any] | None = None) -> None:
        self.call("set_tracker_forwarded", trial_id, tracker, metric_id, progress)

    def add_tracker_checkpoint(self, trial_id: int, tracker: str, uuid: str) -> None:
        self.call("add_tracker_checkpoint", trial_id, tracker, uuid)

    def metrics_after(self, trial_id: int, after_id: int, *, limit: int = 1000) -> list[MetricRecord]:
        return self.call("metrics_after", trial_id, after_id, limit=limit)

    def metrics_at(self, trial_id: int, group: str, steps_completed: int, before_id: int) -> list[MetricRecord]:
        return self.call("metrics_at", trial_id, group, steps_completed, before_id)

    if not TYPE_CHECKING:  # at run time only: for the type checker, a method outside the contract does not exist
        def __getattr__(self, name: str) -> Any:
            if name.startswith("_"):
                raise AttributeError(name)
            raise AttributeError(f"{name!r}: trial processes reach the store over the channel, which serves only "
                                 f"the TrialStore methods ({', '.join(sorted(TRIAL_STORE_METHODS))})")


def open_store(run_dir: str | os.PathLike[str]) -> TrialStore:
    """The store a trial process writes to: the runner's channel when ``$DET_STORE_CHANNEL`` holds its
    token (trials on other machines), else the run folder's SQLite file (both checked against the contract here)."""
    token = os.environ.get(STORE_CHANNEL_ENV)
    if token:
        return RemoteStore(ChannelToken.loads(token), run_dir)
    return LocalStore(run_dir)


def own_store(store: TrialStore) -> LocalStore:
    """``store`` as the run folder's ``LocalStore``, for a plain script (no launcher): it is its one-trial
    experiment's runner, so it also registers, adopts and ends experiments, which a trial process may not."""
    if isinstance(store, LocalStore):
        return store
    raise RuntimeError(f"a plain script (no launcher) needs its run folder's own store, not {store!r}, which serves "
                       f"only a trial's calls (TrialStore): unset ${STORE_CHANNEL_ENV}")
