"""The loop's schedule in every unit, with plain functions: where validations, checkpoints, reports and the
end fall for periods and explicit points in batches, records (not a multiple of the batch size) and epochs."""

from __future__ import annotations

from pathlib import Path

import pytest
from plain_adapter import run_loop

from determined_trials.loop import Batch, Epoch, Record, TrainUnit

# 10 records in batches of 3: epochs of 4 batches (the last one holds 1 record); a Record(n) is n // 3 batches
RECORDS, BATCH_SIZE, EPOCH_LEN = 10, 3, 4

CASES = [
    # validation, checkpoint, reporting, length, validated at, checkpointed at, reported at (batches)
    (Batch(3), Batch(5), None, Batch(11), [3, 6, 9, 11], [5, 10, 11], [3, 5, 6, 9, 10, 11]),
    (Epoch(1), Epoch(2), None, Epoch(3), [4, 8, 12], [8, 12], [4, 8, 12]),
    (Record(7), Record(10), Record(4), Record(25), [2, 4, 6, 8], [3, 6, 8], [1, 2, 3, 4, 5, 6, 7, 8]),
    (Batch([2, 5]), Epoch([1, 2]), None, Epoch(3), [2, 5, 12], [4, 8, 12], [2, 4, 5, 8, 12]),
    (Record([4, 20]), Record([9]), None, Record(30), [1, 6, 10], [3, 10], [1, 3, 6, 10]),
    (Epoch(1), Record(8), Batch(3), Batch(10), [4, 8, 10], [2, 4, 6, 8, 10], [2, 3, 4, 6, 8, 9, 10]),
    (None, None, Epoch(1), Epoch(2), [8], [8], [4, 8]),  # the end always validates and checkpoints
]
IDS = ["batches", "epochs", "records", "points", "record-points", "mixed", "none"]


@pytest.mark.parametrize(("validation", "checkpoint", "reporting", "length", "validated", "checkpointed", "reported"),
                         CASES, ids=IDS)
def test_boundaries_fall_where_the_units_say(
    tmp_path: Path, validation: TrainUnit | None, checkpoint: TrainUnit | None, reporting: TrainUnit | None,
    length: TrainUnit, validated: list[int], checkpointed: list[int], reported: list[int],
) -> None:
    run = run_loop(tmp_path, records=RECORDS, batch_size=BATCH_SIZE, max_length=length,
                   validation_period=validation, checkpoint_period=checkpoint, reporting_period=reporting)
    total = validated[-1]
    assert [b for b, _, _ in run.adapter.trained] == list(range(total))
    assert run.steps_of("validation_end") == validated
    assert [m.steps_completed for m in run.validation] == validated
    assert run.steps_of("upload_end") == checkpointed
    assert [c.steps_completed for c in run.checkpoints] == checkpointed
    assert run.steps_of("workload_end") == reported
    assert [m.steps_completed for m in run.training] == reported
    epochs = -(-total // EPOCH_LEN)
    assert [e[1] for e in run.events if e[0] == "epoch_start"] == list(range(epochs))
    assert run.steps_of("epoch_end") == list(range(EPOCH_LEN, total + 1, EPOCH_LEN))
    final = run.stored[run.checkpoints[-1].uuid].trial_state
    assert (final["batches_trained"], final["epochs_trained"]) == (total, total // EPOCH_LEN)
    # each validation is reported with the epochs completed by then
    assert [m.metrics["epochs"] for m in run.validation] == [v // EPOCH_LEN for v in validated]


def test_every_record_of_an_epoch_is_trained_once_with_a_short_last_batch(tmp_path: Path) -> None:
    run = run_loop(tmp_path, records=RECORDS, batch_size=BATCH_SIZE, max_length=Epoch(2))
    for epoch in (0, 1):
        batches = [records for _, e, records in run.adapter.trained if e == epoch]
        assert [len(b) for b in batches] == [3, 3, 3, 1]
        assert sorted(r for b in batches for r in b) == list(range(1, RECORDS + 1))
