"""DistributedContext: layout checks, addresses, and collectives between real processes (pyzmq), including
dead, closed, hung and diverging peers, two jobs on one host, preemption signals, and run_ranks itself."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest
import ranks_distributed as ranks
import zmq

from determined_trials.core import DistributedContext, _distributed
from determined_trials.core._distributed import dummy_distributed
from determined_trials.core.transport import _addresses
from determined_trials.core.transport._chief import ChiefEnd
from determined_trials.core.transport._common import StarSpec
from determined_trials.core.transport._worker import WorkerEnd
from determined_trials.errors import CollectiveError
from determined_trials.testing import RanksFailed, free_port, run_ranks

_ENV = ("DET_JOB_ID", "DET_CHIEF_IP", "DET_CORE_PORT", "DET_COLLECTIVE_TIMEOUT", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "GROUP_WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    yield
    assert multiprocessing.active_children() == [], "a test left a process running"


def _ctx(**kw: Any) -> DistributedContext:
    layout = {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1, "cross_rank": 0, "cross_size": 1}
    return DistributedContext(**{**layout, **kw})


def _in_threads(*fns: Callable[[], Any]) -> list[Any]:
    """Run each callable in its own thread; return its result or the exception it raised."""
    out: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    return out


# -- size 1, validation, factories, addresses (one process) ---------------------------------------

def test_size_one_opens_no_sockets_and_collectives_are_trivial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("zmq.Context", lambda *a, **k: pytest.fail("a size-1 context opened a zmq context"))
    for dist in (dummy_distributed(), _ctx()):
        with dist:
            assert (dist.rank, dist.size, dist.get_num_agents(), dist.get_local_size()) == (0, 1, 1, 1)
            assert dist.gather(1) == [1] and dist.allgather({"a": 1}) == [{"a": 1}]
            assert dist.broadcast("x") == "x" and dist.gather_local(2) == [2]
            assert dist.allgather_local(3) == [3] and dist.broadcast_local(4) == 4
            assert dist._chief_poll_worker_signals() is False
            dist._worker_send_signal()
            assert dist._chief_poll_worker_signals() is True
        dist.close()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"rank": 2, "size": 2, "local_size": 2}, ValueError, r"rank must be in 0\.\.1"),
    ({"rank": -1}, ValueError, "rank must be in"),
    ({"size": 0}, ValueError, "size=0.*at least 1"),
    ({"local_rank": 1}, ValueError, "local_rank must be in 0..0"),
    ({"size": 2, "local_size": 1}, ValueError, "cross_size=1.*local_size must equal size"),
    ({"size": 2, "rank": 1, "local_size": 2}, ValueError, "local_rank must equal rank"),
    ({"size": 2, "local_size": 2, "cross_size": 2}, ValueError, "more than size=2"),
    ({"cross_rank": 1}, ValueError, "cross_rank must be in"),
    ({"rank": 1.0}, TypeError, "rank=.*must be an int"),
    ({"size": True}, TypeError, "size=.*must be an int"),
    ({"pub_port": "12360"}, TypeError, "pub_port"),
    ({"timeout": 0}, ValueError, "positive number of seconds"),
    ({"size": 3, "local_size": 2, "cross_size": 2}, ValueError, "chief's IP address.*DET_CHIEF_IP"),
])
def test_bad_arguments_are_clear_errors(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        _ctx(**kwargs)


def test_bad_timeout_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DET_COLLECTIVE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="DET_COLLECTIVE_TIMEOUT='soon'"):
        _ctx()


class _FakeTransport:
    """Stands in for the sockets: records what the context asked for."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, layout: Any, **kw: Any) -> None:
        self.made.append({"layout": layout.as_dict(), **kw})

    def close(self) -> None:
        pass


def test_factories_read_their_launchers_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_distributed, "Transport", _FakeTransport)
    _FakeTransport.made.clear()
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
           "GROUP_WORLD_SIZE": "2"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match="chief's IP"):
        DistributedContext.from_torch_distributed()
    dist = DistributedContext.from_torch_distributed(chief_ip="10.0.0.1")
    assert (dist.rank, dist.size, dist.local_rank, dist.local_size, dist.cross_rank, dist.cross_size) == \
        (5, 8, 1, 4, 1, 2)
    monkeypatch.setenv("DET_CHIEF_IP", "10.0.0.2")
    for k, v in {"LOCAL_SIZE": "4", "CROSS_RANK": "1", "CROSS_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    dist = DistributedContext.from_deepspeed()
    assert (dist.get_rank(), dist.get_local_rank(), dist.get_cross_rank(), dist.get_num_agents()) == (5, 1, 1, 2)
    assert [m["chief_ip"] for m in _FakeTransport.made] == ["10.0.0.1", "10.0.0.2"]
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="RANK is not set; run it under torchrun"):
        DistributedContext.from_torch_distributed()


def test_from_horovod_uses_the_module() -> None:
    class Hvd:
        def rank(self) -> int: return 0
        def size(self) -> int: return 1
        local_rank = cross_rank = rank
        local_size = cross_size = size
    dist = DistributedContext.from_horovod(Hvd())
    assert (dist.rank, dist.size, dist.local_size, dist.cross_size) == (0, 1, 1, 1)


def test_job_keys_and_ports_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _addresses.job_key(2).key == f"parent:{os.getppid()}:2"
    assert _addresses.job_key(2).key != _addresses.job_key(3).key
    monkeypatch.setenv("MASTER_ADDR", "10.1.1.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert _addresses.job_key(2).shared and "29500" in _addresses.job_key(2).key
    assert _addresses.tcp_port(None, 0) == 29501
    monkeypatch.setenv("DET_JOB_ID", "job-7")
    assert _addresses.job_key(2).key == "job:job-7"
    monkeypatch.setenv("DET_CORE_PORT", "4000")
    assert _addresses.tcp_port(None, 3) == 4003 and _addresses.tcp_port(5000, 0) == 5000
    monkeypatch.delenv("DET_CORE_PORT")
    monkeypatch.delenv("MASTER_PORT")
    assert _addresses.tcp_port(None, 0) == 12360
    with pytest.raises(ValueError, match="not in 1..65535"):
        _addresses.tcp_port(65535, 1)


def test_long_temp_dirs_fall_back_to_the_abstract_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", "/tmp/" + "d" * 120)
    assert _addresses.ipc_endpoint("abc").startswith("ipc://@det-trials-")


def test_a_live_job_with_the_same_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DET_JOB_ID", uuid.uuid4().hex)
    path = _addresses.ipc_endpoint(_addresses.job_key(2).digest).removeprefix("ipc://")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        try:
            with pytest.raises(RuntimeError, match="another job is already running with the same job key"):
                _ctx(size=2, local_size=2, timeout=5)
        finally:
            os.unlink(path)


def test_stale_socket_files_of_killed_jobs_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    stale = Path(_addresses.ipc_endpoint("stale").removeprefix("ipc://"))
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(stale))  # closed without unlinking, like a job killed with -9
    os.utime(stale, (0, 0))
    _addresses.ensure_unused(_addresses.ipc_endpoint("new"), _addresses.job_key(2))
    assert not stale.exists()


def test_a_busy_tcp_port_is_a_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(CollectiveError, match=f"could not listen on tcp://127.0.0.1:{port}.*free port"):
            _ctx(size=2, local_size=2, force_tcp=True, pub_port=port, timeout=5)


# -- start-up problems (ranks as threads of this process) -----------------------------------------

def test_start_up_names_the_ranks_that_never_connected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DET_JOB_ID", uuid.uuid4().hex)
    with pytest.raises(CollectiveError, match="rank 1 and rank 2 never connected .* within 0.5 s"):
        _ctx(size=3, local_size=3, timeout=0.5)
    with pytest.raises(CollectiveError, match=r"start-up failed on rank 1: the chief \(rank 0\) did not answer"):
        _ctx(rank=1, local_rank=1, size=2, local_size=2, timeout=0.5)


def test_start_up_refuses_inconsistent_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DET_JOB_ID", uuid.uuid4().hex)
    out = _in_threads(lambda: _ctx(size=3, local_size=3, timeout=5),
                      lambda: _ctx(rank=1, local_rank=1, size=3, local_size=3, timeout=5),
                      lambda: _ctx(rank=1, local_rank=1, size=3, local_size=3, timeout=5))
    assert isinstance(out[0], CollectiveError) and "both joined as rank 1" in str(out[0])
    for res in out:
        if isinstance(res, DistributedContext):
            res.close()
    monkeypatch.setenv("DET_JOB_ID", uuid.uuid4().hex)
    out = _in_threads(lambda: _ctx(size=2, local_size=2, timeout=5),
                      lambda: _ctx(rank=1, local_rank=1, size=3, local_size=3, timeout=5))
    assert all(isinstance(e, CollectiveError) for e in out), out
    assert "of a job of size 3, but rank 0 has size 2" in str(out[0])


def test_a_worker_of_another_job_is_turned_away(tmp_path: Path) -> None:
    zctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/star.sock"
    chief = ChiefEnd(zctx, StarSpec("", 0, 2, 0, endpoint, 1.0, "job-a", "rank 0"))
    stranger = WorkerEnd(zctx, StarSpec("", 1, 2, 1, endpoint, 5.0, "job-b", "rank 0"))
    try:
        out = _in_threads(lambda: chief.handshake(lambda hellos: None, lambda index, hellos: None),
                          lambda: stranger.handshake({"rank": 1}))
    finally:
        chief.close()
        stranger.close()
        zctx.term()
    assert "rank 1 never connected" in str(out[0])
    assert isinstance(out[1], CollectiveError) and "belongs to another job" in str(out[1])


# -- collectives between processes ----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("size, local_size", [(2, None), (3, None), (4, 2)])
def test_collectives_between_processes(size: int, local_size: int | None) -> None:
    results = run_ranks(ranks.all_collectives, size, local_size=local_size, timeout=60)
    local = local_size or size
    for r, out in enumerate(results):
        assert out["layout"] == (r, size, r % local, local, r // local, size // local)
        assert out["gather"] == ([{"rank": k, "nested": [k, (k, None)], "set": {k}} for k in range(size)]
                                 if r == 0 else None)
        assert out["allgather"] == [(k, 1 << 20 if k == 1 else 10, bytes([k])) for k in range(size)]
        assert out["broadcast"] == (0, 100_000)
        node = [r // local * local + k for k in range(local)]
        assert out["gather_local"] == (node if r % local == 0 else None)
        assert out["allgather_local"] == [k * 10 for k in node]
        assert out["broadcast_local"] == ("local chief is", node[0])
        assert out["rounds_ok"]


@pytest.mark.slow
def test_workers_may_gather_ahead_of_the_chief() -> None:
    chief, worker = run_ranks(ranks.gather_ahead, 2, timeout=60)
    assert chief == [[(0, i), (1, i)] for i in range(300)]
    assert worker == (300, [0, 1])


@pytest.mark.slow
def test_two_jobs_on_one_host_do_not_collide() -> None:
    jobs = _in_threads(lambda: run_ranks(ranks.job_token, 2, args=("job-a", 1.5)),
                       lambda: run_ranks(ranks.job_token, 2, args=("job-b", 1.5), local_size=1))
    assert jobs == [[["job-a"], ["job-a"]], [["job-b"], ["job-b"]]]


@pytest.mark.slow
@pytest.mark.parametrize("victim, how, says", [
    (1, "kill", "rank 1 disconnected without answering"),
    (1, "exit", "rank 1 disconnected without answering"),
    (1, "return", "rank 1 closed its DistributedContext"),
    (0, "kill", "the connection to rank 0 dropped"),
    (0, "return", "rank 0 closed its DistributedContext"),
])
def test_a_vanished_peer_is_named_quickly(victim: int, how: str, says: str, tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path)}  # a killed chief leaves its socket file behind
    try:
        results = dict(enumerate(run_ranks(ranks.dies_mid_run, 3, args=(victim, how), env=env, timeout=30)))
    except RanksFailed as failed:  # the victim died without a result
        assert list(failed.failures) == [victim]
        results = failed.results
    for rank in {0, 1, 2} - {victim}:
        text, seconds = results[rank]
        assert "allgather #2 failed" in text and says in text, text
        assert seconds < 15


@pytest.mark.slow
def test_a_dead_rank_is_named_by_its_agents_local_chief(tmp_path: Path) -> None:
    with pytest.raises(RanksFailed) as info:
        run_ranks(ranks.dies_in_local, 4, local_size=2, args=(3,), env={"TMPDIR": str(tmp_path)}, timeout=30)
    assert list(info.value.failures) == [3]
    results = info.value.results
    assert results[0] == results[1] == [0, 1]
    text, seconds = results[2]
    assert "allgather_local #2 failed: rank 3 disconnected without answering" in text and seconds < 15


@pytest.mark.slow
def test_a_hung_rank_is_named_after_the_timeout(tmp_path: Path) -> None:
    # the 1.5 s timeout applies once every rank is up; rank 1 hangs until rank 0 has failed on it. The upper
    # bounds leave a loaded machine time to wake the waiting ranks, far below run_ranks' 240 s.
    results = run_ranks(ranks.hangs, 3, args=(1, 1.5, str(tmp_path / "chief-failed")), timeout=240)
    text, seconds = results[0]
    assert "allgather #2 failed: rank 1 did not answer within 1.5 s" in text and 1.4 < seconds < 1.5 + 10
    text, seconds = results[2]
    assert "failed on rank 2: rank 0 aborted allgather #2: rank 1 did not answer" in text and seconds < 1.5 + 10
    assert "rank 1 did not answer" in results[1][0]


@pytest.mark.slow
def test_diverging_ranks_fail_at_once() -> None:
    results = run_ranks(ranks.diverges, 2, timeout=30)
    assert "rank 1 called broadcast #1 where rank 0 called gather" in results[0][0]
    assert "rank 0 aborted gather #1" in results[1][0]
    assert max(r[1] for r in results) < 5


@pytest.mark.slow
@pytest.mark.parametrize("from_thread", [False, True])
def test_a_worker_preemption_signal_reaches_the_chief(from_thread: bool) -> None:
    results = run_ranks(ranks.signals, 2, args=(from_thread,), timeout=30)
    assert results == [(False, True, [0, 1]), (False, True, [0, 1])]


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["torch", "deepspeed"])
def test_factories_build_working_contexts(factory: str) -> None:
    results = run_ranks(ranks.from_env, 2, args=(factory, uuid.uuid4().hex), timeout=30)
    assert results == [((r, 2, r, 2, 0, 1), [0, 7]) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("local_size", [None, 1])
def test_contexts_reopened_at_the_same_address_work(local_size: int | None) -> None:
    env = {"DET_CORE_PORT": str(free_port())}
    results = run_ranks(ranks.reopens, 2, local_size=local_size, args=(5,), env=env, timeout=60)
    assert results == [[2 * i for i in range(5)]] * 2


# -- run_ranks ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_run_ranks_reports_the_failing_ranks_traceback() -> None:
    with pytest.raises(RanksFailed) as info:
        run_ranks(ranks.fails_on, 2, args=(1,), timeout=30)
    assert list(info.value.failures) == [1]
    assert "ValueError: boom on rank 1" in str(info.value) and info.value.results == {0: 0}


@pytest.mark.slow
def test_run_ranks_kills_every_process_on_timeout(tmp_path: Path) -> None:
    """Load-proof: whether or not the ranks got as far as their sleep before the timeout (on a busy
    machine a spawn can take longer than it), none of them is left afterwards."""
    def spawned() -> list[psutil.Process]:
        found = []
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "resource_tracker" not in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        return found

    before = {p.pid for p in spawned()}
    start = time.monotonic()
    with pytest.raises(RanksFailed, match="did not finish within 3 s"):
        run_ranks(ranks.sleeps, 2, args=(600, str(tmp_path)), timeout=3,
                  env={"TMPDIR": str(tmp_path), "DET_COLLECTIVE_TIMEOUT": "600"})  # only the run_ranks timeout
    assert time.monotonic() - start < 120  # far from the ranks' 600 s: they were killed, not awaited
    assert [p for p in spawned() if p.pid not in before] == []
    for pid_file in tmp_path.glob("*.pid"):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)
