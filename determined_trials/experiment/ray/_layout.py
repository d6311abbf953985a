"""Where a trial's slots go on a Ray cluster: one node when they fit (``STRICT_PACK``), else an even
split over several nodes, one bundle (one actor, one launcher) per node (``STRICT_SPREAD``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = ["MULTI_NODE_LAUNCHERS", "Layout", "LayoutError", "multi_node_launcher", "plan_layout"]

# The launchers that run one node's ranks of a trial spread over several nodes (DET_NNODES et al.).
MULTI_NODE_LAUNCHERS = ("determined_trials.launch.torch_distributed", "determined_trials.launch.deepspeed",
                        "determined_trials.launch.tensorflow")


class LayoutError(ValueError):
    """The trial's slots cannot be placed on this cluster (the message says what it asked and offers)."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """``nnodes`` nodes with ``per_node`` slots each (CPUs or GPUs: ``kind``)."""

    nnodes: int
    per_node: int
    kind: str = "CPU"

    @property
    def slots(self) -> int:
        """The trial's slots, all nodes together."""
        return self.nnodes * self.per_node

    @property
    def strategy(self) -> str:
        """The placement group strategy: one node packed, else one bundle on each of distinct nodes."""
        return "STRICT_PACK" if self.nnodes == 1 else "STRICT_SPREAD"

    def bundles(self) -> list[dict[str, float]]:
        """One bundle per node."""
        return [{self.kind: float(self.per_node)} for _ in range(self.nnodes)]

    def describe(self) -> str:
        """E.g. ``2 nodes x 1 CPU``."""
        nodes = "1 node" if self.nnodes == 1 else f"{self.nnodes} nodes"
        return f"{nodes} x {self.per_node} {self.kind}{'s' if self.per_node > 1 else ''}"


def _sizes_text(sizes: Sequence[float]) -> str:
    return ", ".join(f"{size:g}" for size in sorted(sizes, reverse=True)) or "none"


def plan_layout(slots: int, sizes: Sequence[float], *, kind: str = "CPU", max_per_node: int | None = None) -> Layout:
    """The layout for a trial of ``slots`` on alive nodes of ``sizes`` (their CPUs or GPUs), at most
    ``max_per_node`` slots on a node: the fewest nodes that hold an even split; raises ``LayoutError``."""
    usable = [min(size, max_per_node) if max_per_node else size for size in sizes]
    for nnodes in range(1, slots + 1):
        if slots % nnodes:
            continue
        per_node = slots // nnodes
        if sum(1 for size in usable if size >= per_node) >= nnodes:
            return Layout(nnodes, per_node, kind)
    capped = f", at most {max_per_node} per node (resources.max_slots_per_node)" if max_per_node else ""
    asked = f"resources.slots_per_trial is {slots}"
    offered = (f"the Ray cluster offers {sum(usable):g} {kind}s in total over {len(sizes)} node(s) "
               f"({kind}s per node: {_sizes_text(sizes)}{capped})")
    if sum(usable) < slots:
        raise LayoutError(f"{asked} but {offered}: lower slots_per_trial or add nodes")
    raise LayoutError(f"{asked} but {offered}, and a trial's slots are split evenly over the nodes it runs on "
                      f"(one launcher per node): choose a slots_per_trial that some number of these nodes "
                      f"holds in equal parts")


def multi_node_launcher(command: Sequence[str]) -> str | None:
    """The launcher module a trial command runs (``python -m MODULE ...``), if it can span nodes."""
    words = list(command)
    for index, word in enumerate(words[:-1]):
        if word == "-m" and words[index + 1] in MULTI_NODE_LAUNCHERS:
            return words[index + 1]
    return None
