"""Metric values: numpy values and 0-d tensor scalars convert, everything else is an error naming the key."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from determined_trials.core._metrics import (
    check_group_name,
    scalar_items,
    to_json_metrics,
)


def test_numpy_and_tensor_scalars_become_python_numbers() -> None:
    out = to_json_metrics({
        "np_float": np.float32(1.5), "np_int": np.int64(3), "np_0d": np.array(2.5),
        "torch_0d": torch.tensor(0.25), "torch_int": torch.tensor(7), "bool": True,
        "nested": {"a": [np.float64(1.0), torch.tensor(2.0)]}, "text": "ok", "none": None,
    })
    assert out == {"np_float": 1.5, "np_int": 3, "np_0d": 2.5, "torch_0d": 0.25, "torch_int": 7,
                   "bool": True, "nested": {"a": [1.0, 2.0]}, "text": "ok", "none": None}
    assert type(out["np_int"]) is int and type(out["torch_0d"]) is float
    json.dumps(out)


def test_nan_is_kept() -> None:
    assert math.isnan(to_json_metrics({"x": float("nan")})["x"])


@pytest.mark.parametrize("value, hint", [
    (torch.ones(2, 2), "tensor of shape (2, 2)"),
    (object(), "not JSON-serialisable"),
    ({1, 2}, "not JSON-serialisable"),
])
def test_bad_values_name_the_key(value: object, hint: str) -> None:
    with pytest.raises(TypeError) as err:
        to_json_metrics({"good": 1.0, "bad_metric": value})
    assert "bad_metric" in str(err.value) and hint in str(err.value)


def test_nested_bad_value_names_the_path() -> None:
    with pytest.raises(TypeError, match=r"\['outer'\]\['inner'\]\[1\]"):
        to_json_metrics({"outer": {"inner": [1.0, torch.ones(2)]}})


def test_numpy_arrays_are_stored_as_lists() -> None:
    """As Determined stores them (issue 8, item 7); a numpy array of objects still fails by path."""
    out = to_json_metrics({"vec": np.arange(3), "grid": np.ones((2, 2), dtype=np.float32), "one": np.array([0.5])})
    assert out == {"vec": [0, 1, 2], "grid": [[1.0, 1.0], [1.0, 1.0]], "one": [0.5]}
    assert type(out["vec"][0]) is int
    with pytest.raises(TypeError, match=r"\['bad'\]\[0\]"):
        to_json_metrics({"bad": np.array([object()])})


def test_non_string_key_and_non_dict() -> None:
    with pytest.raises(TypeError, match="keys must be strings"):
        to_json_metrics({1: 2.0})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="must be a dict"):
        to_json_metrics([1.0])  # type: ignore[arg-type]


def test_group_names() -> None:
    check_group_name("my-group_1")
    with pytest.raises(ValueError, match="contains '.'"):
        check_group_name("a.b")
    with pytest.raises(ValueError, match="non-empty"):
        check_group_name("")


def test_scalar_items_skips_non_numbers() -> None:
    assert scalar_items({"a": 1, "b": "x", "c": True, "d": 2.5, "e": [1]}) == [("a", 1.0), ("d", 2.5)]
