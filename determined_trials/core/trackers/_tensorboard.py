"""The TensorBoard sink of a trial's tracker runs: its reported metrics as scalars in the trial's TensorBoard folder,
fed by the forwarder like MLflow and W&B, written with tensorboard's own record writer (never TensorFlow).

TensorBoard, unlike MLflow, can drop what a run holds: a ``SessionLog.START`` event at step s makes it drop the
run's earlier events at steps >= s (what ``SummaryWriter(purge_step=s)`` writes). The sink writes one where each
process of the trial starts sending: at the step its attempt resumes from (the lost attempt's points after the
checkpoint, its own events through ``get_tensorboard_path()`` included, give way to the new attempt's), or else
past the last step it was sent (what a killed forwarder wrote but did not record).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from determined_trials.core.store import CheckpointRecord, MetricRecord
from determined_trials.core.trackers._progress import numbers
from determined_trials.core.trackers._sink import Outcome

__all__ = ["ScalarWriter", "TensorBoardSink", "tag_for"]


def tag_for(group: str, key: str) -> str:
    """The TensorBoard tag of a metric: training keys as is, validation as ``val_*``, others group/key."""
    if group == "training":
        return key
    if group == "validation":
        return key if key.startswith("val") else f"val_{key}"
    return f"{group}/{key}"


def _import_tensorboard() -> None:
    """Load tensorboard's protobufs and record writer (never TensorFlow itself)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: F401
    from tensorboard.summary.writer.record_writer import RecordWriter  # noqa: F401


class ScalarWriter:
    """Appends scalar events to one event file in ``logdir`` (created on the first write)."""

    def __init__(self, logdir: Path, *, session_start: bool = True) -> None:
        self._logdir = logdir
        self._file: Any = None
        self._writer: Any = None
        self._held: list[tuple[float, int, list[tuple[str, float]]]] = []
        self._start_step = 0  # the step of the event file's session start (restart_at sets it)
        # without: the file has no START at all (TensorBoard drops what it read before any START at its step or later)
        self._session_start = session_start
        _import_tensorboard()  # once, at start-up: ~0.2 s that must not land in the first report

    def restart_at(self, step: int) -> None:
        """The trial resumes at ``step`` (after its checkpoint at ``step - 1``; 0: from scratch): mark a
        restart now, so that TensorBoard drops the events lost attempts wrote at ``step`` and later.

        TensorBoard takes a run's first START as the session's start, not a restart: a new event file
        opens with its own START, then the restart's (an event file written before these markers, or by
        another writer, has none)."""
        self.flush()
        self._start_step = step
        self._session_start = True
        writer = self._record_writer()  # opened now: a new file starts with its START at ``step``
        _write_start(writer, step)
        writer.flush()

    def hold(self, step: int, scalars: list[tuple[str, float]], wall_time: float) -> None:
        """Hold one event of every (tag, value) at ``step``, reported at ``wall_time``, until ``flush()``."""
        if scalars:
            self._held.append((wall_time, step, scalars))

    def flush(self) -> None:
        """Write the held events, in order, and flush the file."""
        held, self._held = self._held, []
        if held:
            from tensorboard.compat.proto import event_pb2, summary_pb2

            writer = self._record_writer()
            for wall_time, step, scalars in held:
                values = [summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars]
                event = event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=values))
                writer.write(event.SerializeToString())
            writer.flush()

    def close(self) -> None:
        """Write what is held and close the event file; idempotent."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _record_writer(self) -> Any:
        if self._writer is None:
            from tensorboard.compat.proto import event_pb2
            from tensorboard.summary.writer.record_writer import RecordWriter

            self._logdir.mkdir(parents=True, exist_ok=True)
            name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}.0"
            self._writer = RecordWriter(open(self._logdir / name, "wb"))  # noqa: SIM115 - closed by close()
            header = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
            self._writer.write(header.SerializeToString())
            if self._session_start:
                _write_start(self._writer, self._start_step)
        return self._writer


class TensorBoardSink:
    """One trial's TensorBoard "run": its folder (the run id), one event file per process that sends to it."""

    name = "tensorboard"
    rewinds = True

    def __init__(self, logdir: Path, *, first_process: bool = False) -> None:
        self._logdir = logdir
        self._writer: ScalarWriter | None = None
        self._first_process = first_process  # the trial's first process: no lost attempt's events to drop
        _import_tensorboard()  # here, not on the sender's thread: beside the trial's own start-up it takes longer

    def create(self) -> str:
        return str(self._logdir)

    def resume(self, run_id: str, from_step: int) -> str | None:
        """Open this process's event file with TensorBoard's restart marker at ``from_step``; in the trial's first
        process, with no session start at all: nothing may be dropped then, the trial's own event files included,
        whichever file came first."""
        fresh = self._first_process and from_step == 0
        if self._writer is None:
            self._writer = ScalarWriter(Path(run_id), session_start=not fresh)
        if not fresh:
            self._writer.restart_at(from_step)
        return None

    def log(self, rows: Sequence[MetricRecord]) -> None:
        assert self._writer is not None, "resume() opens the event file"
        for row in rows:  # one write and flush per pass of the forwarder
            scalars = [(tag_for(row.group, key), value) for key, value in numbers(row).items()]
            self._writer.hold(row.steps_completed, scalars, row.reported_time.timestamp())
        self._writer.flush()

    def record_checkpoint(self, checkpoint: CheckpointRecord) -> None:
        """TensorBoard has no place for checkpoints."""

    def record_deleted(self, checkpoint: CheckpointRecord) -> None:
        """TensorBoard has no place for checkpoints."""

    def close(self, outcome: Outcome) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _write_start(writer: Any, step: int) -> None:
    """TensorBoard's session start at ``step``: after a run's first, it drops the run's events at ``step``
    and later (a restart)."""
    from tensorboard.compat.proto import event_pb2

    start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
    writer.write(event_pb2.Event(wall_time=time.time(), step=step, session_log=start).SerializeToString())
