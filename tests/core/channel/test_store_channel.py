"""The store channel: a trial's store calls reach the runner's SQLite store over ZeroMQ, only with the
experiment's CURVE token; errors come back as the store raised them. Its contract, ``TrialStore``: what the
server serves, with the signatures that ``LocalStore`` and the client both have."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from determined_trials._info import CLUSTER_INFO_ENV
from determined_trials.core import EarlyExitReason, LocalStore
from determined_trials.core.channel._client import STORE_CHANNEL_ENV, ChannelError, RemoteStore, open_store, own_store
from determined_trials.core.channel._server import ALLOWED_METHODS, ChannelToken, StoreChannelServer
from determined_trials.core.store import TRIAL_STORE_METHODS, TrialStore
from determined_trials.core.store._records import NotFoundError
from determined_trials.experiment._launch import TrialLaunch


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[LocalStore, StoreChannelServer, int]]:
    store = LocalStore(tmp_path / "runs")
    exp = store.create_experiment(name="e", config={})
    trial = store.create_trial(experiment_id=exp, hparams={"lr": 0.1}, seed=3)
    logs: list[tuple[int, list[str]]] = []
    server = StoreChannelServer(store, log_sink=lambda t, lines: logs.append((t, lines)))
    server.logs = logs  # type: ignore[attr-defined]
    try:
        yield store, server, trial
    finally:
        server.close()


def test_writes_and_reads_go_through_the_channel(served: tuple[LocalStore, StoreChannelServer, int],
                                                 tmp_path: Path) -> None:
    store, server, trial = served
    remote = RemoteStore(server.token, tmp_path / "elsewhere", timeout_s=60)
    remote.add_metrics(trial_id=trial, group="training", steps_completed=2, metrics={"loss": float("nan")})
    remote.add_checkpoint(uuid="u1", trial_id=trial, steps_completed=2, metadata={"steps_completed": 2},
                          resources={"a": 3}, storage="s")
    remote.record_searcher_op(trial, 2, 0.5, True)
    remote.set_trial_early_exit(trial, EarlyExitReason.USER_REQUESTED_STOP)
    remote.send_log(trial, ["hello", "world"])
    assert [m.steps_completed for m in store.metrics(trial, "training")] == [2]
    assert store.latest_checkpoint(trial).uuid == "u1"  # type: ignore[union-attr]
    assert remote.latest_checkpoint(trial).resources == {"a": 3}
    assert store.trial(trial).early_exit_reason == "USER_REQUESTED_STOP"
    assert [(op.length, op.metric) for op in store.searcher_ops(trial)] == [(2, 0.5)]
    assert server.logs == [(trial, ["hello", "world"])]  # type: ignore[attr-defined]
    with pytest.raises(NotFoundError, match="999"):
        remote.set_trial_status(999, "x")
    with pytest.raises(ValueError, match="unknown trial state"):
        remote.set_trial_state(trial, "SLEEPING")
    with pytest.raises(AttributeError, match="'create_experiment'.* serves only the TrialStore methods"):
        remote.create_experiment(name="x", config={})  # not in the contract: no request is sent
    remote.close()


def test_a_client_without_the_token_is_refused(served: tuple[LocalStore, StoreChannelServer, int],
                                               tmp_path: Path) -> None:
    store, server, trial = served
    public, secret = zmq.curve_keypair()
    stranger = ChannelToken(server.token.address, server.token.server_public, public.decode(), secret.decode())
    intruder = RemoteStore(stranger, tmp_path, timeout_s=3)
    with pytest.raises(ChannelError, match="did not answer add_metrics"):
        intruder.add_metrics(trial_id=trial, group="training", steps_completed=1, metrics={"loss": 1.0})
    plain = zmq.Context.instance().socket(zmq.REQ)  # no CURVE at all
    plain.rcvtimeo = 3000
    plain.linger = 0
    plain.connect(server.token.address)
    plain.send(b'{"m": "set_trial_status", "a": [1, "pwned"]}')
    with pytest.raises(zmq.Again):
        plain.recv()
    plain.close()
    assert store.metrics(trial) == [] and store.trial(trial).status is None
    assert server.requests == 0


def test_a_refused_method_does_not_run(served: tuple[LocalStore, StoreChannelServer, int], tmp_path: Path) -> None:
    store, server, _ = served
    remote = RemoteStore(server.token, tmp_path, timeout_s=60)
    with pytest.raises(ValueError, match="does not serve 'create_trial': a trial process may call only the TrialStore"):
        remote.call("create_trial", experiment_id=1, hparams={}, seed=1)
    with pytest.raises(ValueError, match="does not serve '_transaction'"):
        remote.call("_transaction")
    assert len(store.trials(1)) == 1
    assert server.requests == 2


def test_open_store_picks_the_channel_from_the_environment(served: tuple[LocalStore, StoreChannelServer, int],
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, server, _ = served
    monkeypatch.delenv(STORE_CHANNEL_ENV, raising=False)
    assert isinstance(open_store(tmp_path / "a"), LocalStore)
    monkeypatch.setenv(STORE_CHANNEL_ENV, server.token.dumps())
    assert isinstance(open_store(tmp_path / "b"), RemoteStore)
    assert not (tmp_path / "b").exists()
    monkeypatch.setenv(STORE_CHANNEL_ENV, "{not json")
    with pytest.raises(ValueError, match="malformed store channel token"):
        open_store(tmp_path / "c")


def _contract_methods() -> set[str]:
    """``TrialStore``'s methods, read from the class (not from ``TRIAL_STORE_METHODS``)."""
    return {name for name, member in inspect.getmembers(TrialStore, inspect.isfunction) if not name.startswith("_")}


def test_the_channel_serves_exactly_the_trial_store_contract() -> None:
    assert ALLOWED_METHODS == TRIAL_STORE_METHODS == _contract_methods()
    assert len(TRIAL_STORE_METHODS) == 29
    runners_only = {"create_experiment", "create_trial", "delete_experiment", "set_experiment_state",
                    "set_experiment_owner", "increment_trial_restarts", "checkpoint", "experiments", "close"}
    assert not runners_only & TRIAL_STORE_METHODS
    assert {"call", "send_log", "close"} | TRIAL_STORE_METHODS == {
        name for name in dir(RemoteStore) if not name.startswith("_")}  # the client offers nothing untyped


@pytest.mark.parametrize("name", sorted(_contract_methods()))
def test_local_store_and_the_client_implement_each_contract_method(name: str) -> None:
    contract = inspect.signature(getattr(TrialStore, name))
    assert inspect.signature(getattr(LocalStore, name)) == contract
    assert inspect.signature(getattr(RemoteStore, name)) == contract


def test_the_client_forwards_each_argument_under_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, tuple[object, ...], dict[str, object]]] = []
    monkeypatch.setattr(RemoteStore, "call", lambda self, method, *a, **kw: sent.append((method, a, kw)))
    remote = RemoteStore(ChannelToken("tcp://127.0.0.1:1", "s", "c", "k"), "elsewhere")
    for name in sorted(TRIAL_STORE_METHODS):
        signature = inspect.signature(getattr(LocalStore, name))
        params = [p for p in signature.parameters.values() if p.name != "self"]
        values = {p.name: f"<{name}.{p.name}>" for p in params}  # none equal to a default
        getattr(remote, name)(*[values[p.name] for p in params if p.kind is p.POSITIONAL_OR_KEYWORD],
                              **{p.name: values[p.name] for p in params if p.kind is p.KEYWORD_ONLY})
        method, args, kwargs = sent.pop()
        assert method == name
        assert dict(signature.bind(None, *args, **kwargs).arguments) == {"self": None, **values}


def test_a_plain_script_needs_the_run_folders_own_store(served: tuple[LocalStore, StoreChannelServer, int],
                                                        tmp_path: Path) -> None:
    store, server, _ = served
    assert own_store(store) is store
    with pytest.raises(RuntimeError, match=f"needs its run folder's own store.*unset \\${STORE_CHANNEL_ENV}"):
        own_store(RemoteStore(server.token, tmp_path))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_core_api_trial_elsewhere_reports_through_the_channel(
        served: tuple[LocalStore, StoreChannelServer, int], tmp_path: Path) -> None:
    store, server, trial = served
    elsewhere = tmp_path / "node2"
    launch = TrialLaunch(experiment_id=1, trial_id=trial, hparams={"lr": 0.1}, seed=3, length=2,
                         config={"searcher": {"name": "single", "metric": "loss", "max_length": 2}},
                         latest_checkpoint=None, steps_completed=0, run_id=1)
    launch.cluster_info(elsewhere / "runs").write(tmp_path / "info.json")
    script = f"""
import determined_trials as det
with det.core.init(checkpoint_storage={str(tmp_path / 'shared')!r}) as ctx:
    for op in ctx.searcher.operations():
        ctx.train.report_training_metrics(steps_completed=op.length, metrics={{"loss": 0.5}})
        with ctx.checkpoint.store_path({{"steps_completed": op.length}}) as (path, _):
            (path / "w").write_text("1")
        op.report_completed(0.25)
"""
    env = {**os.environ, CLUSTER_INFO_ENV: str(tmp_path / "info.json"), STORE_CHANNEL_ENV: server.token.dumps()}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    assert not (elsewhere / "runs" / "store.sqlite").exists()
    assert [m.metrics for m in store.metrics(trial, "training")] == [{"loss": 0.5}]
    assert store.latest_checkpoint(trial).steps_completed == 2  # type: ignore[union-attr]
    assert [(op.length, op.metric, op.completed) for op in store.searcher_ops(trial) if op.completed] == [
        (2, 0.25, True)]
    assert store.trial(trial).state == "COMPLETED"
