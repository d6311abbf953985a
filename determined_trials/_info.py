"""Who this process is: the trial and task facts a launcher or the local experiment runner hands down.

A launcher writes a JSON file and points ``DET_CLUSTER_INFO`` at it; ``get_cluster_info()`` reads it
once. In a bare script there is no such file and ``get_cluster_info()`` returns ``None``.

May import: nothing
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["CLUSTER_INFO_ENV", "ClusterInfo", "TrialInfo", "get_cluster_info"]

CLUSTER_INFO_ENV = "DET_CLUSTER_INFO"


@dataclasses.dataclass(frozen=True)
class TrialInfo:
    """The trial this process trains (names as in Determined's ``det.TrialInfo``)."""

    trial_id: int
    experiment_id: int
    trial_seed: int
    hparams: dict[str, Any]
    config: dict[str, Any]
    steps_completed: int = 0
    trial_run_id: int = 1
    debug: bool = False
    inter_node_network_interface: str | None = None


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """The task facts: the trial, where the run folder is, the checkpoint to resume from."""

    trial: TrialInfo
    run_dir: str
    latest_checkpoint: str | None = None
    task_id: str = ""
    allocation_id: str = ""
    task_type: str = "TRIAL"
    container_addrs: list[str] = dataclasses.field(default_factory=lambda: ["127.0.0.1"])
    container_rank: int = 0
    searcher_lengths: list[int] | None = None
    """The searcher operations (absolute lengths) this process should train through; None: the
    config's ``searcher.max_length`` as one operation."""
    warm_start_checkpoint: str | None = None
    """A trial with no checkpoint of its own starts from this checkpoint's model weights, its counters from 0
    (``searcher.source_trial_id`` / ``source_checkpoint_uuid``, resolved by the experiment runner)."""

    @property
    def container_slot_counts(self) -> list[int]:
        """Slots (processes) on each container (machine) of the trial, in container order."""
        slots = _slots_per_trial(self.trial.config)
        nodes = max(1, len(self.container_addrs))
        return [slots // nodes + (1 if i < slots % nodes else 0) for i in range(nodes)]

    @property
    def slot_ids(self) -> list[int]:
        """The slot numbers of this container: 0 .. its slot count - 1."""
        return list(range(self.container_slot_counts[min(self.container_rank, len(self.container_addrs) - 1)]))

    @property
    def gpu_uuids(self) -> list[str]:
        """GPU UUIDs of this container's slots; empty: local runs do not look GPUs up by UUID."""
        return []

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict that ``from_dict`` reads back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ClusterInfo:
        """Build from ``to_dict()`` output; unknown keys are an error."""
        fields = dict(raw)
        fields["trial"] = TrialInfo(**fields["trial"])
        return cls(**fields)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the JSON file that ``DET_CLUSTER_INFO`` points at; returns its path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_suffix(".tmp")
        staging.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(staging, target)
        return target


def _slots_per_trial(config: dict[str, Any]) -> int:
    resources = config.get("resources") or {}
    slots = resources.get("slots_per_trial", 1) if isinstance(resources, dict) else 1
    return slots if isinstance(slots, int) and slots > 0 else 1


@functools.cache
def _read_cluster_info(path: str) -> ClusterInfo:
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{CLUSTER_INFO_ENV}={path} names a file that does not exist; unset {CLUSTER_INFO_ENV} "
            "to run as a bare script, or start the process through a det-trials launcher"
        ) from None
    return ClusterInfo.from_dict(raw)


def get_cluster_info() -> ClusterInfo | None:
    """The task's info when a launcher or the local experiment runner started us, else ``None``."""
    path = os.environ.get(CLUSTER_INFO_ENV)
    if not path:
        return None
    return _read_cluster_info(path)
