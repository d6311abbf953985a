"""Ray executor pieces that need no cluster: trials in flight, the model archive, the marker probe."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from determined_trials.config import load_config
from determined_trials.core import LocalStore
from determined_trials.experiment._ray_executor import DEFAULT_RAY_PARALLEL, RayExecutor, ray_runner_options
from determined_trials.experiment._ray_node import pack_folder, probe_marker


def _options(tmp_path: Path, max_parallel: int | None, **config: Any) -> dict[str, Any]:
    raw = {"searcher": {"name": "random", "metric": "loss", "max_length": 1, "max_trials": 50}, **config}
    (tmp_path / "config.yaml").write_text("{}")
    return ray_runner_options("auto", store=LocalStore(tmp_path / "runs"), model_dir=tmp_path,
                              config_path=tmp_path / "config.yaml", config=load_config(raw), max_parallel=max_parallel)


@pytest.mark.parametrize(("max_parallel", "config", "expected"), [
    (None, {}, DEFAULT_RAY_PARALLEL),
    (5, {}, 5),
    (None, {"resources": {"max_slots": 8, "slots_per_trial": 2}}, 4),
    (None, {"searcher": {"name": "random", "metric": "loss", "max_length": 1, "max_trials": 9,
                         "max_concurrent_trials": 3}}, 3),
    (7, {"searcher": {"name": "random", "metric": "loss", "max_length": 1, "max_trials": 9,
                      "max_concurrent_trials": 3}}, 3),
])
def test_trials_in_flight_on_ray(tmp_path: Path, max_parallel: int | None, config: dict[str, Any],
                                 expected: int) -> None:
    options = _options(tmp_path, max_parallel, **config)
    assert options["max_parallel"] == expected and options["gpus"] == []
    assert isinstance(options["executor"], RayExecutor)


def test_the_model_archive_round_trips(tmp_path: Path) -> None:
    (tmp_path / "m" / "pkg").mkdir(parents=True)
    (tmp_path / "m" / "train.py").write_text("print(1)\n")
    (tmp_path / "m" / "pkg" / "x.txt").write_text("x")
    with tarfile.open(fileobj=io.BytesIO(pack_folder(tmp_path / "m")), mode="r:gz") as tar:
        tar.extractall(tmp_path / "out", filter="data")
    assert (tmp_path / "out" / "train.py").read_text() == "print(1)\n"
    assert (tmp_path / "out" / "pkg" / "x.txt").read_text() == "x"


def test_the_probe_needs_the_marker_with_its_content(tmp_path: Path) -> None:
    marker = tmp_path / ".probe"
    assert not probe_marker(str(marker), "abc")
    marker.write_text("abc")
    assert probe_marker(str(marker), "abc") and not probe_marker(str(marker), "abd")
