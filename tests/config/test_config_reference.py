"""docs/config-reference.md is generated from the schema: it must match what the generator makes now
(run `make config-reference` after changing the config), and it names every key."""

from __future__ import annotations

from support.helpers_paths import REPO

from determined_trials.config import AdaptiveASHASearcher, ExperimentConfig
from determined_trials.config._reference import render_reference

DOC = REPO / "docs" / "config-reference.md"


def test_the_committed_reference_is_up_to_date() -> None:
    assert DOC.read_text(encoding="utf-8") == render_reference(), (
        "docs/config-reference.md is stale: run `make config-reference` and commit the result")


def test_the_reference_names_every_key_with_its_default() -> None:
    text = render_reference()
    for name in ExperimentConfig.model_fields:
        assert f"| `{name}` |" in text
    for name in AdaptiveASHASearcher.model_fields:
        assert f"| `{name}` |" in text
    assert "### `adaptive_asha`" in text and "### `log`" in text and "### `s3`" in text
    assert "| `max_restarts` | int | `5` |" in text
