"""Streams (IterableDatasets) through det.pytorch.DataLoader on one process: a Hugging Face streaming
dataset and a user's own stateful stream stop mid-epoch and resume bitwise, with and without loader
workers; a plain generator stream resumes exactly by replay, with its one warning; ranks and workers
read disjoint parts covering the epoch; lengths in epochs are errors before the first batch."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
from trials_pytorch import assert_same_state, config, fit, state_snapshot
from trials_stream import SHARD_SIZES, StreamTrial, make_stream, write_shards

from determined_trials import pytorch
from determined_trials.pytorch import Batch, Epoch, Record
from determined_trials.pytorch.data._iterable import STREAM_POSITIONS, StreamPositions
from determined_trials.pytorch.data._loader import StreamReplayWarning

pytestmark = pytest.mark.usefixtures("cpu_device")

TOTAL = sum(SHARD_SIZES)  # 42 records: 11 batches of 4 per pass (the last one of 2)
FIT: dict[str, Any] = {"max_length": Batch(15), "validation_period": Batch(5), "reporting_period": Batch(4)}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("shards")
    write_shards(folder)
    return str(folder)


def stream_config(kind: str, data_dir: str, workers: int = 0) -> dict[str, Any]:
    return config({"global_batch_size": 4, "lr": 0.01, "kind": kind, "data_dir": data_dir, "workers": workers})


def _reference_and_resumed(tmp_path: Path, conf: dict[str, Any], stop_after: int) -> tuple[Any, Any, Any]:
    ref, trainer, _ = fit(StreamTrial, conf, tmp_path / "ref", **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    first, trainer, info = fit(lambda ctx: StreamTrial(ctx, stop_after=stop_after), conf, tmp_path / "run", **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "stopped"
    checkpoint = info["checkpoints"][-1]
    assert checkpoint.steps_completed == stop_after + 1
    second, trainer, _ = fit(StreamTrial, conf, tmp_path / "run", latest_checkpoint=checkpoint.uuid, **FIT)
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    return ref, first, second


@pytest.mark.parametrize(("kind", "workers", "stop_after"), [
    ("hf", 0, 6),     # mid-epoch
    ("user", 0, 10),  # on the last batch of the first pass: the resumed run starts the next pass
    ("hf", 2, 7),     # per-worker positions
    ("user", 2, 7),
])
def test_stateful_stream_resumes_bitwise(tmp_path: Path, data_dir: str, kind: str, workers: int,
                                         stop_after: int) -> None:
    ref, first, second = _reference_and_resumed(tmp_path, stream_config(kind, data_dir, workers), stop_after)
    # the stream's passes are epochs: a whole pass (11 batches; 12 with two workers' partial batches), then
    # the next pass (epoch 1) starts
    epochs = [s[0] for s in ref.seen]
    assert epochs == sorted(epochs) and epochs[-1] == 1
    assert sorted(i for s in ref.seen if s[0] == 0 for i in s[2]) == list(range(TOTAL))
    assert first.seen + second.seen == ref.seen
    assert_same_state(state_snapshot(second), state_snapshot(ref))
    assert second.scheduler.state_dict() == ref.scheduler.state_dict()
    # validation over the stream: one whole pass each time (at batches 5, 10 and 15)
    assert sorted(i for b in ref.validated for i in b) == sorted(list(range(TOTAL)) * 3)


def test_plain_stream_resumes_by_replay_with_one_warning(tmp_path: Path, data_dir: str) -> None:
    conf = stream_config("plain", data_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref, first, second = _reference_and_resumed(tmp_path, conf, stop_after=6)
    replay = [w for w in caught if issubclass(w.category, StreamReplayWarning)]
    assert len(replay) == 3  # one per run (reference, stopped, resumed): one per training loader
    message = str(replay[0].message)
    assert "state_dict()" in message and "load_state_dict()" in message and "replayed" in message
    assert first.seen + second.seen == ref.seen
    assert_same_state(state_snapshot(second), state_snapshot(ref))


@pytest.mark.parametrize("kind", ["hf", "user", "plain"])
def test_ranks_and_workers_read_disjoint_parts_covering_the_epoch(data_dir: str, kind: str) -> None:
    parts = []
    for rank in range(2):
        loader = pytorch.DataLoader(make_stream(kind, data_dir), batch_size=4, num_workers=2 if kind != "plain" else 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StreamReplayWarning)
            stream = loader.build_training_stream(seed=1, rank=rank, num_replicas=2)
        records: list[int] = []
        with stream:
            while True:
                batch = next(stream)
                if stream.epoch_idx > 0:
                    break
                records += batch["i"].tolist()
        parts.append(records)
    assert len(set(parts[0])) == len(parts[0]) and len(set(parts[1])) == len(parts[1])
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == list(range(TOTAL))


def test_a_position_saved_on_another_number_of_ranks_restarts_the_earliest_epoch(
        data_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    saved = []
    for rank in range(2):  # whole shards: parts of 20 and 22 records, passes of 5 and 6 batches
        with pytorch.DataLoader(make_stream("hf", data_dir), batch_size=4).build_training_stream(
                seed=1, rank=rank, num_replicas=2) as stream:
            for _ in range(6):
                next(stream)
            saved.append(stream.state_dict())
    assert [(p["epoch"], p["in_epoch"]) for p in saved] == [(1, 1), (0, 6)]
    positions = StreamPositions()
    positions.on_checkpoint_load_start({"callbacks": {STREAM_POSITIONS: {"ranks": saved}}})
    with pytorch.DataLoader(make_stream("hf", data_dir), batch_size=4).build_training_stream(
            seed=1, start_batch=6) as stream:
        positions.resume(stream, 0, 1)
        records: list[int] = []
        while not records or stream.epoch_idx == 0:
            records += next(stream)["i"].tolist()
    assert records[:-4] == list(range(TOTAL))  # epoch 0 again, whole: nothing lost (then epoch 1's first batch)
    assert stream.position == 6 + 11 + 1
    assert "saved on 2 rank(s) and this run has 1" in caplog.text and "starts epoch 0 from its beginning" in caplog.text


@pytest.mark.parametrize(("workers", "steps", "new_world", "exact"), [
    (0, 3, 1, True), (0, 3, 3, True),  # every reader read its records below one index: merged
    (2, 4, 3, True),  # 2 batches per worker: the same
    (2, 3, 1, False),  # one worker of each rank read a batch more than the other: no prefix, the epoch restarts
])
def test_a_stream_that_merges_positions_goes_on_exactly_on_another_number_of_ranks(
        data_dir: str, caplog: pytest.LogCaptureFixture, workers: int, steps: int, new_world: int,
        exact: bool) -> None:
    caplog.set_level(logging.INFO, logger="determined_trials.pytorch")
    read: list[int] = []
    saved = []
    for rank in range(2):
        loader = pytorch.DataLoader(make_stream("user", data_dir), batch_size=4, num_workers=workers)
        with loader.build_training_stream(seed=1, rank=rank, num_replicas=2) as stream:
            for _ in range(steps):
                read += next(stream)["i"].tolist()
            saved.append(stream.state_dict())
    for rank in range(new_world):
        positions = StreamPositions()
        positions.on_checkpoint_load_start({"callbacks": {STREAM_POSITIONS: {"ranks": saved}}})
        loader = pytorch.DataLoader(make_stream("user", data_dir), batch_size=4, num_workers=workers)
        with loader.build_training_stream(seed=1, rank=rank, num_replicas=new_world, start_batch=steps) as stream:
            positions.resume(stream, rank, new_world)
            while (batch := next(stream)) is not None and stream.epoch_idx == 0:
                read += batch["i"].tolist()
        assert batch["i"][0] == rank * max(workers, 1)  # the next pass starts at its beginning
    if exact:  # each record of the epoch read once, before or after the change
        assert sorted(read) == list(range(TOTAL)) and "merged the ranks' positions" in caplog.text
    else:  # the records read before the stop are read again, nothing is lost
        assert sorted(set(read)) == list(range(TOTAL)) and len(read) == TOTAL + 2 * steps * 4
        assert "starts epoch 0 from its beginning" in caplog.text


@pytest.mark.parametrize(("fit_kwargs", "needle"), [
    ({"max_length": Epoch(2)}, "Epoch(2)"),
    ({"max_length": Batch(4), "validation_period": Epoch(1)}, "Epoch(1)"),
    ({"max_length": Record(40), "checkpoint_period": Epoch(1)}, "Epoch(1)"),
])
def test_lengths_in_epochs_on_a_stream_are_errors(tmp_path: Path, data_dir: str, fit_kwargs: dict[str, Any],
                                                  needle: str) -> None:
    with pytest.raises(ValueError, match="batches or records") as err:
        fit(StreamTrial, stream_config("user", data_dir), tmp_path, **fit_kwargs)
    assert needle in str(err.value)


def test_per_epoch_lr_scheduler_on_a_stream_is_an_error(tmp_path: Path, data_dir: str) -> None:
    trials: list[StreamTrial] = []

    def make(ctx: pytorch.PyTorchTrialContext) -> StreamTrial:
        trials.append(StreamTrial(ctx, epoch_scheduler=True))
        return trials[-1]

    with pytest.raises(ValueError, match="STEP_EVERY_EPOCH.*STEP_EVERY_BATCH"):
        fit(make, stream_config("user", data_dir), tmp_path, max_length=Batch(4))
    assert trials[0].seen == []  # before the first batch
