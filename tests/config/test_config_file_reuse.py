"""A config file read again with the same text reuses the last parse and validation (a warm trial process reads
the config its warm parent read), as a copy of its own; a changed file is read again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from determined_trials.config import _load, load_config, load_raw

_TEXT = "name: first\nsearcher: {name: single, metric: loss, max_length: 4}\nhyperparameters: {lr: 0.1}\n"


def test_the_same_text_is_parsed_once_and_each_reader_gets_its_own_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parses: list[str] = []
    real = _load._parse_yaml

    def counting(text: str, source: str) -> Any:
        parses.append(text)
        return real(text, source)

    validations: list[Any] = []
    real_validate = _load.validate_raw

    def counting_validate(raw: Any, origin: Any = None) -> Any:
        validations.append(origin)
        return real_validate(raw, origin)

    monkeypatch.setattr(_load, "_parse_yaml", counting)
    monkeypatch.setattr(_load, "validate_raw", counting_validate)
    path = tmp_path / "config.yaml"
    path.write_text(_TEXT.replace("first", "reuse-check"))
    first, _ = load_raw(path)
    first["hyperparameters"]["lr"] = 99.0  # the reader's copy, not the kept parse
    second, _ = load_raw(path)
    assert second["hyperparameters"] == {"lr": 0.1}
    one, two = load_config(path), load_config(str(path))
    assert one.name == "reuse-check" and one == two and one is not two
    one.hyperparameters["lr"] = 99.0  # a copy of its own again
    assert load_config(path).hyperparameters["lr"] == 0.1
    assert len(parses) == 1 and len(validations) == 1

    path.write_text(_TEXT.replace("first", "edited"))
    assert load_config(path).name == "edited"
    assert len(parses) == 2 and len(validations) == 2


def test_a_file_that_does_not_parse_is_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("name: [unclosed\n")
    for _ in range(2):  # the same error each time, never a kept result
        with pytest.raises(Exception, match="YAML syntax error"):
            load_raw(path)
