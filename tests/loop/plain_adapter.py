"""A pure-Python trial for the loop's own tests (no torch, no TensorFlow): the "model" is a float, a batch is
a slice of a Python list, and every batch trained, hook fired and adapter call made is recorded in order.

What the loop's protocol sees beyond its plain methods is kept in few places, so that a change of the
protocol is a local edit here: ``SaveMode`` with ``_declare_save_mode`` (how the adapter says how it saves)
and the adapter's "optional members" section (what each save mode calls), and ``_enter_batch`` /
``_leave_batch`` (how the adapter steps the loop's clock around a batch).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from determined_trials import core, loop
from determined_trials.loop import (
    TRIAL_STATE_FILE,
    Clock,
    Controller,
    DataShape,
    ExitReason,
    HookRunner,
    LoopSettings,
)

__all__ = ["Event", "HookRecorder", "PlainAdapter", "PlainRun", "SaveMode", "StoredCheckpoint", "run_loop"]

Event = tuple[Any, ...]
MODEL_FILE = "model.json"


class SaveMode(enum.Enum):
    """The ways the loop saves today: the chief alone on the training thread; a snapshot written by the loop's
    writer thread; a small state saved on the training thread and published by the writer; every rank's shard;
    every rank's shard written in the background."""

    SYNC = "sync"
    SNAPSHOT = "snapshot"
    STAGED = "staged"
    SHARDED = "sharded"
    ASYNC_SHARDED = "async_sharded"


_LOOP_MODES = {SaveMode.SYNC: loop.SaveMode.SYNC_CHIEF, SaveMode.SNAPSHOT: loop.SaveMode.ASYNC_SNAPSHOT,
               SaveMode.STAGED: loop.SaveMode.ASYNC_SNAPSHOT, SaveMode.SHARDED: loop.SaveMode.SHARDED,
               SaveMode.ASYNC_SHARDED: loop.SaveMode.ASYNC_SHARDED}


def _declare_save_mode(adapter: PlainAdapter, mode: SaveMode) -> None:
    """How the adapter tells the loop its save mode: the loop's ``SaveMode`` (``save_mode``), and for the two
    snapshot modes whether a snapshot is wanted (STAGED: the small state saved on the training thread)."""
    adapter.loop_mode = _LOOP_MODES[mode]
    adapter.sharded_save = adapter.loop_mode.sharded
    adapter.snapshot_wanted = mode is SaveMode.SNAPSHOT


def _shard_file(rank: int) -> str:
    return f"shard-{rank}.json"


class HookRecorder:
    """A callback recording every loop hook into ``events`` (with its telling argument), and its own state:
    how many validations it saw, saved with checkpoints and restored on resume."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.validations = 0

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        self.events.append(("startup", first_batch_idx, checkpoint_uuid))

    def on_training_start(self) -> None:
        self.events.append(("training_start",))

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.events.append(("epoch_start", epoch_idx))

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.events.append(("epoch_end", epoch_idx))

    def on_training_workload_end(self, metrics: dict[str, Any], batch_metrics: list[Any]) -> None:
        self.events.append(("workload_end",))

    def on_validation_start(self) -> None:
        self.events.append(("validation_start",))

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.validations += 1
        self.events.append(("validation_end", metrics["validation_loss"]))

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        self.events.append(("upload_end", uuid))

    def on_trial_shutdown(self) -> None:
        self.events.append(("shutdown",))

    def state_dict(self) -> dict[str, Any]:
        return {"validations": self.validations}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.validations = int(state["validations"])


class PlainAdapter(loop.TrialAdapter):
    """The loop's adapter over ``records`` (ints) in global batches of ``batch_size``, the last one of an epoch
    possibly short; epoch ``e`` reads the records rotated by ``e``. Training batch ``b`` of epoch ``e`` sets
    ``w = w / 2 + sum(b) * (e + 1)``, so that a lost, repeated or reordered batch changes ``w``.

    ``trained`` lists ``(batch_idx, epoch_idx, records)`` per batch; ``after_batch(adapter, batches_trained)``
    runs after each batch (to ask for a stop or a preemption there)."""

    framework = "plain"

    def __init__(self, hooks: HookRunner, events: list[Event], *, records: int = 8, batch_size: int = 2,
                 mode: SaveMode = SaveMode.SYNC, after_batch: Callable[[PlainAdapter, int], None] | None = None
                 ) -> None:
        self.hooks, self.events = hooks, events
        self.records, self.batch_size = list(range(1, records + 1)), batch_size
        self.epoch_len = -(-records // batch_size)
        self.after_batch = after_batch
        self.w = 0.0
        self.trained: list[tuple[int, int, tuple[int, ...]]] = []
        self.stop = False
        self.core: core.Context | None = None  # set by ``run_loop``: for ``after_batch`` to ask for a preemption
        self.threads: dict[str, str] = {}  # adapter method -> the thread it last ran on
        self.loop_mode = loop.SaveMode.SYNC_CHIEF
        self.sharded_save = self.snapshot_wanted = False
        _declare_save_mode(self, mode)
        self._stream: Iterator[tuple[int, int, tuple[int, ...]]] = iter(())
        self._losses: list[float] = []
        self._writes: concurrent.futures.ThreadPoolExecutor | None = None

    # -- the data and the clock ------------------------------------------------------------------

    def _batches(self, start: int) -> Iterator[tuple[int, int, tuple[int, ...]]]:
        """``(epoch_idx, in_epoch, records)`` of every batch from global batch ``start`` on, forever."""
        epoch_idx, in_epoch = divmod(start, self.epoch_len)
        while True:
            shift = epoch_idx % len(self.records)
            order = self.records[shift:] + self.records[:shift]
            for k in range(in_epoch, self.epoch_len):
                yield epoch_idx, k, tuple(order[k * self.batch_size:(k + 1) * self.batch_size])
            epoch_idx, in_epoch = epoch_idx + 1, 0

    def _enter_batch(self, epoch_idx: int, in_epoch: int, state: Clock) -> None:
        opened = state.begin(1)[:2]
        if opened != (epoch_idx, in_epoch):
            raise AssertionError(f"the clock says batch {opened[1]} of epoch {opened[0]}, the data batch {in_epoch} of epoch {epoch_idx}")

    def _leave_batch(self, in_epoch: int, state: Clock) -> None:
        state.advance(1)

    # -- the adapter protocol ------------------------------------------------------------------

    def load(self, path: Path) -> None:
        saved = json.loads((path / MODEL_FILE).read_text())
        self.w = saved["w"]
        if self.sharded_save and json.loads((path / _shard_file(self._rank())).read_text())["w"] != self.w:
            raise AssertionError(f"rank {self._rank()}'s shard does not hold the model of {path}")
        self.hooks.load_state_dict(saved["callbacks"])
        self._record("load", saved["w"])

    def start_training(self, state: Clock) -> DataShape:
        self._stream = self._batches(state.batches_trained)
        self._record("start_training", state.batches_trained)
        return DataShape(epoch_len=self.epoch_len, global_batch_size=self.batch_size)

    def train(self, num_batches: int, state: Clock, should_stop: Callable[[], bool]) -> None:
        for _ in range(num_batches):
            epoch_idx, in_epoch, batch = next(self._stream)
            self._enter_batch(epoch_idx, in_epoch, state)
            self.events.append(("batch", state.batches_trained))
            self.trained.append((state.batches_trained, epoch_idx, batch))
            self.w = self.w / 2 + sum(batch) * (epoch_idx + 1)
            self._losses.append(self.w)
            self._leave_batch(in_epoch, state)
            if self.after_batch is not None:
                self.after_batch(self, state.batches_trained)
            if should_stop():
                return

    def stop_requested(self) -> bool:
        return self.stop

    def training_metrics(self) -> dict[str, Any]:
        losses, self._losses = self._losses, []
        return {"loss": sum(losses) / len(losses)} if losses else {}

    def validate(self, *, test_mode: bool = False) -> dict[str, Any]:
        self._record("validate")
        return {"validation_loss": self.w}

    def save(self, path: Path) -> None:
        self._record("save", self.w)
        self._write(self._state(), path)

    def close(self) -> None:
        self._record("close")
        if self._writes is not None:
            self._writes.shutdown(wait=True)
            self._writes = None

    # -- the optional members: what each save mode calls (``_declare_save_mode`` says which mode) -----

    @property
    def save_mode(self) -> loop.SaveMode:
        return self.loop_mode

    def prepare_checkpoint(self) -> None:
        self._record("prepare_checkpoint")

    def wants_snapshot(self) -> bool:
        return self.snapshot_wanted

    def snapshot(self) -> dict[str, Any]:
        self._record("snapshot", self.w)
        return self._state()

    def write_snapshot(self, snapshot: dict[str, Any], path: Path) -> None:
        self._record("write_snapshot", snapshot["w"])
        self._write(snapshot, path)

    def start_sharded_save(self, path: Path) -> concurrent.futures.Future[None]:
        self._record("start_sharded_save", self.w)
        if self._writes is None:
            self._writes = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="plain-shard-writer")
        return self._writes.submit(self._write, self._state(), path)

    # -- helpers ---------------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return {"w": self.w, "callbacks": self.hooks.state_dict()}

    def _write(self, state: dict[str, Any], path: Path) -> None:
        """The chief writes the model; a sharded save's every rank writes its shard too."""
        self._record("write", state["w"])
        if self._rank() == 0:
            (path / MODEL_FILE).write_text(json.dumps(state))
        if self.sharded_save:
            (path / _shard_file(self._rank())).write_text(json.dumps({"w": state["w"]}))

    def _rank(self) -> int:
        return 0 if self.core is None else self.core.distributed.get_rank()

    def _record(self, call: str, *args: Any) -> None:
        self.threads[call] = threading.current_thread().name
        self.events.append((call, *args))


@dataclasses.dataclass(frozen=True)
class StoredCheckpoint:
    """A checkpoint as read back through the Core API: its file names, ``trial_state.json``, the model file."""

    files: list[str]
    trial_state: dict[str, int]
    model: dict[str, Any]


class PlainRun:
    """What one ``run_loop`` left: the exit reason, the ordered events, the adapter, the trial and its store."""

    def __init__(self, reason: ExitReason, events: list[Event], adapter: PlainAdapter, recorder: HookRecorder,
                 trial_id: int, checkpoints: list[Any], training: list[Any], validation: list[Any]) -> None:
        self.reason, self.events, self.adapter, self.recorder = reason, events, adapter, recorder
        self.trial_id, self.checkpoints, self.training, self.validation = trial_id, checkpoints, training, validation
        self.stored: dict[str, StoredCheckpoint] = {}  # by uuid

    def steps_of(self, name: str) -> list[int]:
        """For each ``name`` event, how many batches had been trained then."""
        steps, batches = [], 0
        for event in self.events:
            if event[0] == "startup":
                batches = event[1]
            elif event[0] == "batch":
                batches = event[1] + 1
            elif event[0] == name:
                steps.append(batches)
        return steps


def run_loop(run_dir: Path, *, latest_checkpoint: str | None = None, mode: SaveMode = SaveMode.SYNC,
             records: int = 8, batch_size: int = 2,
             after_batch: Callable[[PlainAdapter, int], None] | None = None, events: list[Event] | None = None,
             config: dict[str, Any] | None = None, distributed: core.DistributedContext | None = None,
             **settings: Any) -> PlainRun:
    """One ``Controller.run`` of a ``PlainAdapter`` under ``core.init(run_dir=..., config=..., distributed=...)`` (resuming
    ``latest_checkpoint``, continuing its trial), with ``LoopSettings(**settings)``; its events go to
    ``events`` (a new list when None)."""
    settings.setdefault("max_length", None)
    settings.setdefault("checkpoint_policy", "none")
    settings.setdefault("show_progress", False)
    settings.setdefault("summaries", False)
    events = [] if events is None else events
    recorder = HookRecorder(events)
    hooks = HookRunner({"recorder": recorder})
    adapter = PlainAdapter(hooks, events, records=records, batch_size=batch_size, mode=mode, after_batch=after_batch)
    with core.init(run_dir=run_dir, config=config, latest_checkpoint=latest_checkpoint,
                   distributed=distributed) as ctx:
        adapter.core = ctx
        controller = Controller(core=ctx, adapter=adapter, hooks=hooks, settings=LoopSettings(**settings))
        reason = controller.run(ctx.info.latest_checkpoint)
        trial_id = ctx.info.trial.trial_id
        checkpoints = ctx.store.checkpoints(trial_id=trial_id)
        run = PlainRun(reason, events, adapter, recorder, trial_id, checkpoints,
                       ctx.store.metrics(trial_id, group="training"), ctx.store.metrics(trial_id, group="validation"))
        for checkpoint in checkpoints:
            with ctx.checkpoint.restore_path(checkpoint.uuid) as path:
                run.stored[checkpoint.uuid] = StoredCheckpoint(
                    files=sorted(p.name for p in path.iterdir()),
                    trial_state=json.loads((path / TRIAL_STATE_FILE).read_text()),
                    model=json.loads((path / MODEL_FILE).read_text()),
                )
    return run
