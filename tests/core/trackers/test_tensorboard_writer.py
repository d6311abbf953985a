"""The TensorBoard sink's event files: a resumed attempt's event file carries TensorBoard's restart marker, so the
TensorBoard server's reader drops what the lost attempt wrote after the checkpoint."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from support.helpers_tensorboard import tensorboard_points

from determined_trials.core.trackers._tensorboard import ScalarWriter


def _attempt(logdir: Path, steps: range, offset: float, restart_at: int | None) -> None:
    writer = ScalarWriter(logdir)
    if restart_at is not None:
        writer.restart_at(restart_at)
    for step in steps:
        writer.hold(step, [("loss", offset + step)], time.time())
    writer.close()
    time.sleep(0.002)  # the next attempt's file name (its creation time) sorts after this one


def test_a_resumed_attempt_supersedes_the_lost_events(tmp_path: Path) -> None:
    _attempt(tmp_path, range(1, 8), 100.0, None)  # the lost attempt, after its checkpoint at step 4
    _attempt(tmp_path, range(5, 10), 0.0, restart_at=5)
    assert tensorboard_points(tmp_path)["loss"] == [(1, 101.0), (2, 102.0), (3, 103.0), (4, 104.0),
                                                   (5, 5.0), (6, 6.0), (7, 7.0), (8, 8.0), (9, 9.0)]


def test_a_second_restart_and_a_start_over(tmp_path: Path) -> None:
    _attempt(tmp_path, range(1, 5), 100.0, None)
    _attempt(tmp_path, range(3, 7), 200.0, restart_at=3)
    _attempt(tmp_path, range(5, 8), 0.0, restart_at=5)
    assert [v for _, v in tensorboard_points(tmp_path)["loss"]] == [101.0, 102.0, 203.0, 204.0, 5.0, 6.0, 7.0]
    _attempt(tmp_path, range(0, 2), 0.0, restart_at=0)  # launched again without a checkpoint: from scratch
    assert tensorboard_points(tmp_path)["loss"] == [(0, 0.0), (1, 1.0)]


def test_an_event_file_without_markers_is_superseded_too(tmp_path: Path) -> None:
    """A file written before restart markers existed (or by another writer) has no session start of its own."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    with open(tmp_path / f"events.out.tfevents.{time.time() - 60:.6f}.{socket.gethostname()}.1.0", "wb") as f:
        writer = RecordWriter(f)
        writer.write(event_pb2.Event(wall_time=0, file_version="brain.Event:2").SerializeToString())
        for step in range(1, 6):
            value = summary_pb2.Summary.Value(tag="loss", simple_value=100.0 + step)
            writer.write(event_pb2.Event(step=step, summary=summary_pb2.Summary(value=[value])).SerializeToString())
        writer.flush()
    _attempt(tmp_path, range(3, 6), 0.0, restart_at=3)
    assert tensorboard_points(tmp_path)["loss"] == [(1, 101.0), (2, 102.0), (3, 3.0), (4, 4.0), (5, 5.0)]


def test_a_restart_in_the_same_writer(tmp_path: Path) -> None:
    """Fit twice in one process, the second from an earlier checkpoint: the marker goes into the open file."""
    writer = ScalarWriter(tmp_path)
    for step in range(1, 6):
        writer.hold(step, [("loss", 100.0 + step)], time.time())
    writer.restart_at(3)
    for step in range(3, 5):
        writer.hold(step, [("loss", float(step))], time.time())
    writer.close()
    assert tensorboard_points(tmp_path)["loss"] == [(1, 101.0), (2, 102.0), (3, 3.0), (4, 4.0)]
