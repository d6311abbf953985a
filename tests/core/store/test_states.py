"""The store's state enums (determined_trials.core.store): each member behaves as its plain string wherever
states go (str, f-strings, format, json, sqlite3, comparisons and sets with raw strings read back), and no
module of the package spells a state as a string literal instead."""

from __future__ import annotations

import ast
import json
import operator
import pickle
import sqlite3
from pathlib import Path

import pytest
from support.helpers_paths import REPO

from determined_trials.core import LocalStore
from determined_trials.core.store import CheckpointState, RunState
from determined_trials.core.store._schema import _TABLES

PACKAGE = REPO / "determined_trials"
ALL_STATES = [*RunState, *CheckpointState]
VALUES = {member.value for member in ALL_STATES}


def test_members_and_their_order() -> None:
    assert [s.value for s in RunState] == ["ACTIVE", "PAUSED", "COMPLETED", "ERROR", "CANCELED"]
    assert [s.value for s in CheckpointState] == ["PENDING", "COMPLETED", "DELETED"]
    assert LocalStore.EXPERIMENT_STATES == ("ACTIVE", "PAUSED", "COMPLETED", "ERROR", "CANCELED")
    assert LocalStore.TRIAL_STATES == ("ACTIVE", "PAUSED", "COMPLETED", "ERROR", "CANCELED")
    assert LocalStore.CHECKPOINT_STATES == ("PENDING", "COMPLETED", "DELETED")


@pytest.mark.parametrize("member", ALL_STATES, ids=lambda m: f"{type(m).__name__}.{m.name}")
def test_a_member_is_its_string(member: RunState | CheckpointState) -> None:
    text = member.value
    assert isinstance(member, str) and member == text and text == member
    assert not operator.ne(member, text) and not operator.ne(text, member)
    assert hash(member) == hash(text) and {text: 1}[member] == 1 and {member: 1}[text] == 1
    assert str(member) == text and type(str(member)) is str
    assert f"{member}" == text and f"{member:>12}" == f"{text:>12}" and format(member, "") == text
    assert "{}".format(member) == text and "%s" % member == text  # noqa: UP031, UP032 (the formats are the point)
    assert member + " (why)" == text + " (why)" and member.lower() == text.lower()
    assert json.dumps(member) == json.dumps(text) and json.dumps({member: [member]}) == json.dumps({text: [text]})
    assert type(member)(text) is member and pickle.loads(pickle.dumps(member)) is member


def test_sqlite_stores_the_plain_text_and_matches_it() -> None:
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE TABLE t (state TEXT)")
        conn.executemany("INSERT INTO t VALUES (?)", [(m,) for m in ALL_STATES])
        rows = conn.execute("SELECT state, typeof(state) FROM t").fetchall()
        assert rows == [(m.value, "text") for m in ALL_STATES] and all(type(r[0]) is str for r in rows)
        for member in ALL_STATES:
            assert conn.execute("SELECT COUNT(*) FROM t WHERE state = ?", (member,)).fetchone()[0] >= 1
    finally:
        conn.close()


def test_the_store_writes_and_reads_back_plain_strings(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    exp = store.create_experiment(name="e", config={})
    trial = store.create_trial(experiment_id=exp, hparams={}, seed=0)
    assert store.experiment(exp).state == RunState.ACTIVE and store.trial(trial).state == RunState.ACTIVE
    store.set_trial_state(trial, RunState.PAUSED, "paused")
    store.set_experiment_state(exp, RunState.CANCELED)
    assert type(store.trial(trial).state) is str and store.trial(trial).state == "PAUSED"
    assert store.trial(trial).status == "paused" and store.trial(trial).end_time is None
    assert type(store.experiment(exp).state) is str and store.experiment(exp).state == "CANCELED"
    assert store.experiment(exp).end_time is not None  # CANCELED is terminal
    store.add_checkpoint(uuid="u", trial_id=trial, steps_completed=1, metadata={}, resources={}, storage="s")
    record = store.checkpoint("u")
    assert type(record.state) is str and record.state == CheckpointState.COMPLETED
    store.close()
    raw = sqlite3.connect(tmp_path / "store.sqlite")
    try:
        assert raw.execute("SELECT state FROM trials").fetchall() == [("PAUSED",)]
        assert raw.execute("SELECT state FROM experiments").fetchall() == [("CANCELED",)]
    finally:
        raw.close()


def test_schema_defaults_are_the_first_states() -> None:
    assert _TABLES.count(f"DEFAULT '{RunState.ACTIVE}'") == 2  # experiments, trials
    assert f"DEFAULT '{CheckpointState.COMPLETED}'" in _TABLES


def test_terminal_and_unfinished_sets() -> None:
    assert {"COMPLETED", "ERROR", "CANCELED"} == RunState.TERMINAL
    assert {"ACTIVE", "PAUSED"} == RunState.UNFINISHED
    assert set(RunState) == RunState.TERMINAL | RunState.UNFINISHED and not RunState.TERMINAL & RunState.UNFINISHED
    assert "ERROR" in RunState.TERMINAL and "PAUSED" not in RunState.TERMINAL  # raw strings, as read from SQLite
    assert len(RunState) == 5 and "TERMINAL" not in RunState.__members__


def test_no_state_is_spelled_as_a_literal() -> None:
    """Every state in the package is an enum member: no string constant equal to a state's value outside
    ``_states.py`` (SQL text with a state inside, such as the schema's defaults, is not such a constant)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_states.py" and path.parent.name == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in VALUES:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}")
    assert not found, "state literals (use RunState / CheckpointState):\n" + "\n".join(found)
