"""Ray executor pieces that need no cluster: trials in flight, the model archive, the marker probe, where a
trial's slots go, and how a run over several nodes ends."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from determined_trials.config import load_config
from determined_trials.core import LocalStore
from determined_trials.experiment._launch import trial_command
from determined_trials.experiment.ray._executor import DEFAULT_RAY_PARALLEL, RayExecutor, ray_runner_options
from determined_trials.experiment.ray._files import merge_tensorboard, pack_tensorboard
from determined_trials.experiment.ray._handle import RayTrialRun
from determined_trials.experiment.ray._layout import LayoutError, multi_node_launcher, plan_layout
from determined_trials.experiment.ray._node import pack_folder, probe_marker


def _options(tmp_path: Path, max_parallel: int | None, **config: Any) -> dict[str, Any]:
    raw = {"searcher": {"name": "random", "metric": "loss", "max_length": 1, "max_trials": 50}, **config}
    (tmp_path / "config.yaml").write_text("{}")
    return ray_runner_options("auto", store=LocalStore(tmp_path / "runs"), model_dir=tmp_path,
                              config_path=tmp_path / "config.yaml", config=load_config(raw), max_parallel=max_parallel)


@pytest.mark.parametrize(("max_parallel", "config", "expected"), [
    (None, {}, DEFAULT_RAY_PARALLEL),
    (5, {}, 5),
    (None, {"resources": {"max_slots": 8, "slots_per_trial": 2}}, 4),
    (None, {"searcher": {"name": "random", "metric": "loss", "max_length": 1, "max_trials": 9,
                         "max_concurrent_trials": 3}}, 3),
    (7, {"searcher": {"name": "random", "metric": "loss", "max_length": 1, "max_trials": 9,
                      "max_concurrent_trials": 3}}, 3),
])
def test_trials_in_flight_on_ray(tmp_path: Path, max_parallel: int | None, config: dict[str, Any],
                                 expected: int) -> None:
    options = _options(tmp_path, max_parallel, **config)
    assert options["max_parallel"] == expected and options["gpus"] == []
    assert isinstance(options["executor"], RayExecutor)


def test_the_model_archive_round_trips(tmp_path: Path) -> None:
    (tmp_path / "m" / "pkg").mkdir(parents=True)
    (tmp_path / "m" / "train.py").write_text("print(1)\n")
    (tmp_path / "m" / "pkg" / "x.txt").write_text("x")
    with tarfile.open(fileobj=io.BytesIO(pack_folder(tmp_path / "m")), mode="r:gz") as tar:
        tar.extractall(tmp_path / "out", filter="data")
    assert (tmp_path / "out" / "train.py").read_text() == "print(1)\n"
    assert (tmp_path / "out" / "pkg" / "x.txt").read_text() == "x"


def test_the_probe_needs_the_marker_with_its_content(tmp_path: Path) -> None:
    marker = tmp_path / ".probe"
    assert not probe_marker(str(marker), "abc")
    marker.write_text("abc")
    assert probe_marker(str(marker), "abc") and not probe_marker(str(marker), "abd")


@pytest.mark.parametrize(("slots", "sizes", "cap", "expected"), [
    (1, [2, 1], None, (1, 1, "STRICT_PACK")),
    (2, [2, 1], None, (1, 2, "STRICT_PACK")),  # fits the head: one node
    (2, [1, 1], None, (2, 1, "STRICT_SPREAD")),
    (2, [2, 1], 1, (2, 1, "STRICT_SPREAD")),  # the cap splits it
    (8, [4, 4, 2], None, (2, 4, "STRICT_SPREAD")),
    (6, [4, 4, 2], None, (2, 3, "STRICT_SPREAD")),
    (6, [2, 2, 2], None, (3, 2, "STRICT_SPREAD")),
])
def test_a_trial_gets_the_fewest_nodes_of_an_even_split(slots: int, sizes: list[float], cap: int | None,
                                                        expected: tuple[int, int, str]) -> None:
    layout = plan_layout(slots, sizes, max_per_node=cap)
    assert (layout.nnodes, layout.per_node, layout.strategy) == expected
    assert layout.bundles() == [{"CPU": float(layout.per_node)}] * layout.nnodes and layout.slots == slots


def test_a_trial_the_cluster_cannot_hold_is_refused_with_what_it_asked_and_offers() -> None:
    with pytest.raises(LayoutError, match=r"slots_per_trial is 4 but the Ray cluster offers 2 GPUs in total over "
                                          r"2 node\(s\) \(GPUs per node: 1, 1\): lower"):
        plan_layout(4, [1, 1], kind="GPU")
    with pytest.raises(LayoutError, match=r"offers 3 CPUs in total .*\(CPUs per node: 2, 1\).*split evenly"):
        plan_layout(3, [2, 1])
    with pytest.raises(LayoutError, match=r"at most 1 per node \(resources.max_slots_per_node\)"):
        plan_layout(4, [4, 4, 4], max_per_node=1)


@pytest.mark.parametrize(("entrypoint", "launcher"), [
    ("python3 -m determined_trials.launch.torch_distributed --trial t.py:T",
     "determined_trials.launch.torch_distributed"),
    ("model_def:MyTrial", "determined_trials.launch.torch_distributed"),
    (["python3", "-m", "determined_trials.launch.deepspeed", "--trial", "t.py:T"], "determined_trials.launch.deepspeed"),
    ("python3 train.py", None),
    ("python3 -m determined_trials.launch.tensorflow --trial t.py:T", "determined_trials.launch.tensorflow"),
])
def test_which_entrypoints_can_span_nodes(entrypoint: Any, launcher: str | None) -> None:
    assert multi_node_launcher(trial_command(entrypoint)) == launcher


class _FakeRef:
    def __init__(self, result: Any) -> None:
        self.result = result


class _FakeActor:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name
        self.kill_now = self.signal = self

    def remote(self, *args: Any) -> _FakeRef:
        self.log.append(f"{self.name}:{args[0] if args else 'kill_now'}")
        return _FakeRef(None)


class _FakeRay:
    """Enough of ``ray`` for ``RayTrialRun``: refs whose result is set (or an exception) are ready."""

    class exceptions:  # noqa: N801 - the name ray uses
        RayError = RuntimeError

    def __init__(self) -> None:
        self.killed: list[str] = []
        self.util = self
        self.removed = 0

    def wait(self, refs: list[_FakeRef], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Any], list[Any]]:
        ready = [r for r in refs if r.result is not None]
        return ready, [r for r in refs if r.result is None]

    def get(self, ref: _FakeRef) -> Any:
        if isinstance(ref.result, Exception):
            raise ref.result
        return ref.result

    def kill(self, actor: _FakeActor) -> None:
        self.killed.append(actor.name)

    def remove_placement_group(self, group: Any) -> None:
        self.removed += 1


def test_a_node_that_dies_stops_the_other_nodes_part_at_once() -> None:
    ray, log = _FakeRay(), []
    actors = [_FakeActor(log, "a0"), _FakeActor(log, "a1")]
    refs = [_FakeRef(None), _FakeRef(None)]
    run = RayTrialRun(ray, actors, refs, group="g")
    assert run.poll() is None
    refs[1].result = RuntimeError("node gone")
    assert run.poll() == 1
    assert "died on node 1 of 2" in run.reason(1)
    assert log == ["a0:kill_now"] and sorted(ray.killed) == ["a0", "a1"] and ray.removed == 1


def test_a_paused_spread_trial_waits_for_every_node_and_gives_the_preempted_status() -> None:
    ray, log = _FakeRay(), []
    actors = [_FakeActor(log, "a0"), _FakeActor(log, "a1")]
    refs = [_FakeRef(None), _FakeRef(None)]
    run = RayTrialRun(ray, actors, refs, group=None)
    run.terminate()
    assert log == ["a0:TERM", "a1:TERM"]
    refs[1].result = (75, "")
    assert run.poll() is None  # node 0 is still checkpointing
    refs[0].result = (75, "")
    assert run.poll() == 75 and ray.killed == ["a0", "a1"]


def test_a_preempted_part_waits_for_the_others_and_a_dead_one_wins() -> None:
    ray, log = _FakeRay(), []
    actors = [_FakeActor(log, "a0"), _FakeActor(log, "a1")]
    refs = [_FakeRef((75, "")), _FakeRef(None)]  # node 0 stopped on a preemption it was not asked for
    run = RayTrialRun(ray, actors, refs, group=None)
    assert run.poll() is None and log == []
    refs[1].result = RuntimeError("actor gone")  # ... because node 1's actor died
    assert run.poll() == 1 and "died on node 1 of 2" in run.reason(1)



def test_tensorboard_files_of_a_node_reach_the_runners_run_folder(tmp_path: Path) -> None:
    node, runner = tmp_path / "node", tmp_path / "runner"
    for name in ("trial_3", "trial_3-rank1-staging", "trial_30", "trial_4"):
        (node / "tensorboard" / "experiment_1" / name).mkdir(parents=True)
        (node / "tensorboard" / "experiment_1" / name / "events.out").write_bytes(name.encode())
    archive = pack_tensorboard(node, 1, 3)
    (runner / "tensorboard" / "experiment_1" / "trial_3").mkdir(parents=True)
    (runner / "tensorboard" / "experiment_1" / "trial_3" / "events.out").write_bytes(b"trial_3")  # shared already
    added = merge_tensorboard(archive, runner)
    assert [p.relative_to(runner).as_posix() for p in added] == [
        "tensorboard/experiment_1/trial_3-rank1-staging/events.out"]
    assert sorted(p.parent.name for p in (runner / "tensorboard").rglob("events.out")) == [
        "trial_3", "trial_3-rank1-staging"]
    assert pack_tensorboard(node, 1, 5) == b"" and merge_tensorboard(b"", runner) == []


def test_an_archive_cannot_write_outside_tensorboard(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in ("store.sqlite", "tensorboard/../store.sqlite", "tensorboard/ok.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    assert [p.name for p in merge_tensorboard(buffer.getvalue(), tmp_path)] == ["ok.txt"]
    assert not (tmp_path / "store.sqlite").exists()


def test_the_tensorboard_archive_of_a_part_goes_to_the_runner() -> None:
    ray, log, got = _FakeRay(), [], []
    refs = [_FakeRef((0, "", b"tb0")), _FakeRef((0, "", b""))]
    run = RayTrialRun(ray, [_FakeActor(log, "a0"), _FakeActor(log, "a1")], refs, group=None, on_files=got.append)
    assert run.poll() == 0 and got == [b"tb0"]


class _Nodes:
    """``ray.nodes()`` of a cluster with alive nodes of these CPUs."""

    def __init__(self, *cpus: float) -> None:
        self._cpus = cpus

    def nodes(self) -> list[dict[str, Any]]:
        return [{"Alive": True, "Resources": {"CPU": c}} for c in self._cpus] + [{"Alive": False, "Resources": {"CPU": 64}}]


def _executor(tmp_path: Path) -> RayExecutor:
    (tmp_path / "config.yaml").write_text("{}")
    return RayExecutor("auto", store=LocalStore(tmp_path / "runs"), model_dir=tmp_path,
                       config_path=tmp_path / "config.yaml", use_gpus=False)


def test_the_executor_plans_a_spread_trial_and_refuses_one_without_a_launcher(tmp_path: Path) -> None:
    from determined_trials.experiment.ray._executor import RayExecutorError

    spread = {"searcher": {"name": "single", "metric": "loss", "max_length": 1},
              "resources": {"slots_per_trial": 2, "max_slots_per_node": 1}}
    launcher = load_config({**spread, "entrypoint": "model_def:MyTrial"})
    layout = _executor(tmp_path)._plan(_Nodes(2, 1), launcher)
    assert (layout.nnodes, layout.per_node, layout.strategy) == (2, 1, "STRICT_SPREAD")
    with pytest.raises(RayExecutorError, match=r"runs on 2 nodes x 1 CPU, .*the entrypoint must be one"):
        _executor(tmp_path)._plan(_Nodes(2, 1), load_config({**spread, "entrypoint": "python3 train.py"}))
    fits = load_config({**spread, "entrypoint": "python3 train.py", "resources": {"slots_per_trial": 2}})
    assert _executor(tmp_path)._plan(_Nodes(2, 1), fits).nnodes == 1  # one node: any entrypoint
    with pytest.raises(RayExecutorError, match=r"slots_per_trial is 4 but the Ray cluster offers 3 CPUs in total"):
        _executor(tmp_path)._plan(_Nodes(2, 1), load_config({**spread, "resources": {"slots_per_trial": 4}}))
