"""``RayExecutor``: trials as Ray actors on a Ray cluster, each with its slots (CPUs or GPUs; a
multi-slot trial in one placement group, packed on one node when it fits, else one actor per node of an
even split), reporting to the runner's store over the store channel. Ray is imported only for ``--ray``."""

from __future__ import annotations

import contextlib
import secrets
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from determined_trials.core.channel import StoreChannelServer
from determined_trials.core.store import LocalStore
from determined_trials.experiment import ExperimentError, TrialHandle, TrialJob, trial_command
from determined_trials.experiment.ray._files import merge_tensorboard
from determined_trials.experiment.ray._handle import RayTrialRun
from determined_trials.experiment.ray._layout import Layout, LayoutError, multi_node_launcher, plan_layout
from determined_trials.experiment.ray._node import NodeRole, TrialActor, pack_folder, probe_marker

__all__ = ["DEFAULT_RAY_PARALLEL", "RayExecutor", "RayExecutorError", "ray_runner_options"]

DEFAULT_RAY_PARALLEL = 16  # trials in flight when nothing bounds them (Ray queues what does not fit)
_PROBE_TIMEOUT_S = 120.0


class RayExecutorError(ExperimentError):
    """The experiment cannot run on this Ray cluster as configured (said before any trial runs)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RayExecutorError("--ray needs Ray: pip install 'determined_trials[ray]'") from exc
    return ray


@contextlib.contextmanager
def _keeping_stop_signals() -> Iterator[None]:
    """Ray's worker installs its own SIGINT/SIGTERM handlers; keep the runner's (pause, then kill)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class RayExecutor:
    """Runs each trial as a Ray actor; ``address``: ``auto``, ``ray://host:port``, or None (a Ray
    started on this machine). ``use_gpus``: slots are GPUs (default: when the cluster has any)."""

    def __init__(self, address: str | None, *, store: LocalStore, model_dir: Path, config_path: Path,
                 use_gpus: bool | None = None, bind: str = "0.0.0.0") -> None:
        self._address = address
        self._store = store
        self._model_dir = model_dir
        self._config_text = config_path.read_text()
        self._use_gpus = use_gpus
        self._bind = bind
        self._started_ray = False
        self._channel: StoreChannelServer | None = None
        self._model_ref: Any = None
        self._actor_class: Any = None
        self._jobs: dict[int, TrialJob] = {}
        self._layout = Layout(1, 1)
        self._log_lock = threading.Lock()

    # -- set-up -----------------------------------------------------------------------------------
    def prepare(self, config: Any, storage: Any) -> None:
        """Connect to Ray, refuse checkpoint storage some node cannot see, open the store channel."""
        ray = self._connect()
        self._actor_class = ray.remote(TrialActor)
        if self._use_gpus is None:
            self._use_gpus = ray.cluster_resources().get("GPU", 0) > 0
        self._layout = self._plan(ray, config)
        self._check_storage(ray, storage)
        host = ray.util.get_node_ip_address()
        self._channel = StoreChannelServer(self._store, host=host, bind=self._bind, log_sink=self._on_log)
        self._model_ref = ray.put(pack_folder(self._model_dir))

    def _connect(self) -> Any:
        """Ray, initialised (connecting to the cluster, or starting one here, when not yet done)."""
        ray = _ray()
        if ray.is_initialized():
            return ray
        try:
            with _keeping_stop_signals():
                ray.init(address=self._address, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = self._address or "a new local Ray"
            raise RayExecutorError(f"cannot start or reach Ray ({where}): {exc}; pass --ray auto on a node of "
                                   "a running cluster (`ray start --head`), or --ray ray://HEAD:10001") from exc
        self._started_ray = True
        return ray

    def _plan(self, ray: Any, config: Any) -> Layout:
        """Where a trial's slots go on the alive nodes; refuse (before any trial runs) what the cluster
        cannot hold, else Ray would queue the trials for ever, and a spread trial without a launcher."""
        kind = "GPU" if self._use_gpus else "CPU"
        sizes = [n.get("Resources", {}).get(kind, 0) for n in ray.nodes() if n.get("Alive")]
        try:
            layout = plan_layout(config.resources.slots_per_trial, sizes, kind=kind,
                                 max_per_node=config.resources.max_slots_per_node)
        except LayoutError as exc:
            raise RayExecutorError(f"{exc} (one trial over several machines: docs/ray.md)") from None
        command = trial_command(config.entrypoint) if config.entrypoint else []
        if layout.nnodes > 1 and multi_node_launcher(command) is None:
            raise RayExecutorError(
                f"resources.slots_per_trial is {layout.slots}: the trial runs on {layout.describe()}, and on "
                "every node a launcher starts that node's ranks; the entrypoint must be one "
                "(`python3 -m determined_trials.launch.torch_distributed --trial model_def:MyTrial`, or "
                "launch.deepspeed, launch.tensorflow), not "
                f"{config.entrypoint!r}; or raise resources.max_slots_per_node so that the trial fits one node")
        return layout

    def _check_storage(self, ray: Any, storage: Any) -> None:
        """A directory store must be the same folder on every alive node: each node reads a marker."""
        folder = storage.local_folder()  # a StorageManager
        if folder is None:
            return  # a bucket (S3, GCS, Azure): reachable over the network
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        marker, content = Path(folder) / f".det-trials-probe-{secrets.token_hex(8)}", secrets.token_hex(16)
        marker.write_text(content)
        try:
            probe = ray.remote(num_cpus=0, max_retries=0)(probe_marker)
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                    .remote(str(marker), content) for n in nodes]
            seen = ray.get(refs, timeout=_PROBE_TIMEOUT_S)
        finally:
            marker.unlink(missing_ok=True)
        blind = [f"{n.get('NodeManagerAddress')} ({n['NodeID'][:12]})" for n, ok in zip(nodes, seen) if not ok]
        if blind:
            raise RayExecutorError(
                f"checkpoint storage {folder} is a directory that Ray node(s) {', '.join(blind)} cannot see: "
                "trials there could neither save nor restore checkpoints. Mount one shared folder at the same "
                "path on every node (checkpoint_storage: {type: shared_fs, host_path: ...}) or use a bucket "
                "(s3, gcs, azure).")

    # -- trials -----------------------------------------------------------------------------------
    def start(self, job: TrialJob) -> TrialHandle:
        """Ask Ray for the trial's slots (one placement group) and start its actor on each node there."""
        ray = _ray()
        assert self._channel is not None, "prepare() first"
        self._jobs[job.launch.trial_id] = job
        layout = self._layout if job.slots == self._layout.slots else Layout(1, job.slots, self._layout.kind)
        self._store.set_trial_status(job.launch.trial_id, f"waiting for Ray to place it ({layout.describe()})")
        group = None
        if layout.slots > 1:
            group = ray.util.placement_group(layout.bundles(), strategy=layout.strategy)
        job_id = f"trial-{job.launch.experiment_id}.{job.launch.trial_id}.{job.launch.run_id}-{uuid.uuid4().hex[:12]}"
        actors = [self._actor_class.options(max_concurrency=4, max_restarts=0,
                                            **self._resources(layout, group, node_rank)).remote()
                  for node_rank in range(layout.nnodes)]
        refs = [actor.run.remote(job.launch, self._model_ref, job.entrypoint, str(job.run_dir), self._config_text,
                                 self._channel.token.dumps(),
                                 NodeRole(layout.nnodes, node_rank, job_id, layout.per_node, tuple(actors)))
                for node_rank, actor in enumerate(actors)]
        run_dir = job.run_dir
        return RayTrialRun(ray, actors, refs, group, on_files=lambda archive: merge_tensorboard(archive, run_dir))

    def _resources(self, layout: Layout, group: Any, node_rank: int) -> dict[str, Any]:
        """The actor options for node ``node_rank``'s part: its slots, in its bundle of the group."""
        slots = layout.per_node
        need: dict[str, Any] = {"num_gpus": slots, "num_cpus": 0} if self._use_gpus else {"num_cpus": slots}
        if group is None:
            return need
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=node_rank)
        return {**need, "scheduling_strategy": strategy}

    def _on_log(self, trial_id: int, lines: list[str]) -> None:
        job = self._jobs.get(trial_id)
        if job is None:
            return
        with self._log_lock, open(job.log_path, "a", encoding="utf-8") as log:
            for line in lines:
                log.write(line + "\n")
                job.echo(job.prefix + line)

    def close(self) -> None:
        """Stop the channel and disconnect from Ray (shutting down a Ray this executor started)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._started_ray:
            _ray().shutdown()
            self._started_ray = False


def ray_runner_options(address: str, *, store: LocalStore, model_dir: Path, config_path: Path, config: Any,
                       max_parallel: int | None) -> dict[str, Any]:
    """The ``ExperimentRunner`` arguments for a run on Ray: the executor and the trials in flight
    (``max_parallel``, else ``resources.max_slots // slots_per_trial``, else the searcher's
    ``max_concurrent_trials``, else 16; never more than ``max_concurrent_trials``)."""
    per_trial = config.resources.slots_per_trial
    concurrent = config.searcher.concurrency_cap() or 0
    wanted = max_parallel
    if wanted is None and config.resources.max_slots is not None:
        wanted = config.resources.max_slots // per_trial
    wanted = max(1, wanted or concurrent or DEFAULT_RAY_PARALLEL)
    if concurrent:
        wanted = min(wanted, concurrent)
    executor = RayExecutor(None if address == "local" else address, store=store, model_dir=model_dir,
                           config_path=config_path)
    return {"executor": executor, "max_parallel": wanted, "gpus": []}
