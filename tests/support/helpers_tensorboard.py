"""Reading a trial's TensorBoard folder back the way the TensorBoard server does (its plugin event
accumulator, which drops the events a restart marker supersedes), for the one-timeline tests."""

from __future__ import annotations

from pathlib import Path

__all__ = ["tensorboard_points"]


def tensorboard_points(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of the scalars in ``logdir``'s event files, as TensorBoard shows them."""
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.util import tensor_util

    acc = plugin_event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto).item())) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}
