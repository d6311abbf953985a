"""Experiment configuration: parsing, defaults, error messages, round trip, hparam sampling and grids."""

from __future__ import annotations

import copy
import json
import math
import pickle
import random
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from determined_trials.config import (
    AdaptiveASHASearcher,
    AzureStorage,
    CategoricalHP,
    ConfigWarning,
    ExperimentConfig,
    GCSStorage,
    GridSearcher,
    IntHP,
    Length,
    LogHP,
    RandomSearcher,
    S3Storage,
    SharedFSStorage,
    SingleSearcher,
    grid_points,
    load_config,
    sample_hparams,
)
from determined_trials.errors import ConfigError

SINGLE = {"name": "single", "metric": "validation_loss"}

FULL_YAML = """
name: mnist-full
description: every field set
labels: [mnist, cnn]
entrypoint: model_def:MnistTrial
hyperparameters:
  global_batch_size: 64
  lr: {type: log, base: 10, minval: -4, maxval: -1, count: 3}
  dropout: {type: double, minval: 0.1, maxval: 0.5, count: 2}
  layers: {type: int, minval: 1, maxval: 4, count: 4}
  optimizer: {type: categorical, vals: [sgd, adam]}
  seed_const: {type: const, val: 7}
  arch:
    width: {type: int, minval: 8, maxval: 16}
    act: relu
searcher:
  name: adaptive_asha
  metric: accuracy
  smaller_is_better: false
  max_length: {epochs: 3}
  max_trials: 8
  max_concurrent_trials: 2
  divisor: 3
  max_rungs: 4
  mode: aggressive
records_per_epoch: 1000
min_validation_period: {batches: 200}
min_checkpoint_period: {epochs: 1}
perform_initial_validation: true
checkpoint_storage:
  type: shared_fs
  host_path: /tmp/ckpts
  storage_path: mnist
  save_experiment_best: 2
  save_trial_best: 1
  save_trial_latest: 3
checkpoint_policy: all
scheduling_unit: 50
optimizations:
  aggregation_frequency: 2
  average_aggregated_gradients: false
  average_training_metrics: false
  gradient_compression: true
  mixed_precision: O1
resources:
  slots_per_trial: 2
  max_slots: 4
  resource_pool: gpus
  priority: 10
  shm_size: 4G
max_restarts: 0
reproducibility: {experiment_seed: 42}
profiling: {enabled: true, begin_on_batch: 10, end_after_batch: 20, sync_timings: false}
data: {url: "https://example.invalid/mnist.tgz", when: 2024-01-01}
environment: {environment_variables: [A=1]}
debug: true
"""


def _error(source: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(source)
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# valid configs


def test_full_config_every_field(tmp_path: Path) -> None:
    path = tmp_path / "full.yaml"
    path.write_text(FULL_YAML)
    cfg = load_config(path)
    assert cfg.name == "mnist-full" and cfg.description == "every field set"
    assert cfg.labels == ("mnist", "cnn") and cfg.entrypoint == "model_def:MnistTrial"
    assert isinstance(cfg.hyperparameters["lr"], LogHP) and cfg.hyperparameters["lr"].count == 3
    assert isinstance(cfg.hyperparameters["optimizer"], CategoricalHP)
    assert isinstance(cfg.hyperparameters["arch"]["width"], IntHP)
    assert cfg.hyperparameters["arch"]["act"] == "relu"
    s = cfg.searcher
    assert isinstance(s, AdaptiveASHASearcher)
    assert (s.metric, s.smaller_is_better, s.max_trials, s.divisor, s.max_rungs, s.mode) == (
        "accuracy", False, 8, 3.0, 4, "aggressive")
    assert s.max_length == Length(3, "epochs") and s.max_concurrent_trials == 2
    assert cfg.records_per_epoch == 1000 and cfg.perform_initial_validation is True
    assert cfg.min_validation_period == Length(200, "batches")
    assert cfg.min_checkpoint_period == Length(1, "epochs")
    st = cfg.checkpoint_storage
    assert isinstance(st, SharedFSStorage)
    assert (st.host_path, st.storage_path, st.save_experiment_best, st.save_trial_latest) == (
        "/tmp/ckpts", "mnist", 2, 3)
    assert cfg.checkpoint_policy == "all" and cfg.scheduling_unit == 50
    o = cfg.optimizations
    assert (o.aggregation_frequency, o.average_aggregated_gradients, o.average_training_metrics,
            o.gradient_compression, o.mixed_precision) == (2, False, False, True, "O1")
    r = cfg.resources
    assert (r.slots_per_trial, r.max_slots, r.resource_pool, r.priority, r.shm_size) == (2, 4, "gpus", 10, "4G")
    assert cfg.max_restarts == 0 and cfg.reproducibility.experiment_seed == 42
    p = cfg.profiling
    assert (p.enabled, p.begin_on_batch, p.end_after_batch, p.sync_timings) == (True, 10, 20, False)
    assert cfg.data == {"url": "https://example.invalid/mnist.tgz", "when": "2024-01-01"}  # no datetime
    assert cfg.environment == {"environment_variables": ["A=1"]} and cfg.debug is True


def test_minimal_config_defaults() -> None:
    cfg = load_config({"searcher": SINGLE})
    assert cfg.name == "experiment" and cfg.description == "" and cfg.labels == ()
    assert cfg.entrypoint is None and cfg.hyperparameters == {}
    assert cfg.searcher == SingleSearcher(metric="validation_loss")
    assert cfg.searcher.smaller_is_better is True and cfg.searcher.max_length is None
    assert cfg.records_per_epoch == 0 and cfg.min_validation_period is None
    assert cfg.min_checkpoint_period is None and cfg.perform_initial_validation is False
    assert cfg.checkpoint_storage is None and cfg.checkpoint_policy == "best"
    assert cfg.scheduling_unit == 100 and cfg.max_restarts == 5
    o = cfg.optimizations
    assert (o.aggregation_frequency, o.average_aggregated_gradients, o.average_training_metrics,
            o.gradient_compression, o.mixed_precision) == (1, True, True, False, "O0")
    assert cfg.resources.slots_per_trial == 1 and cfg.reproducibility.experiment_seed is None
    p = cfg.profiling
    assert (p.enabled, p.begin_on_batch, p.end_after_batch, p.sync_timings) == (False, 0, None, True)
    assert cfg.data == {} and cfg.environment == {} and cfg.debug is False


def test_searcher_variants_and_defaults() -> None:
    rnd = load_config({"searcher": {"name": "random", "metric": "m", "max_trials": 5, "max_length": 100}}).searcher
    assert isinstance(rnd, RandomSearcher) and rnd.max_concurrent_trials == 16
    assert rnd.max_length == Length(100, None)
    grid = load_config({"searcher": {"name": "grid", "metric": "m"}}).searcher
    assert isinstance(grid, GridSearcher) and grid.max_concurrent_trials == 16
    asha = load_config({"searcher": {"name": "adaptive_asha", "metric": "m", "max_trials": 4,
                                     "max_length": {"records": 10}}}).searcher
    assert isinstance(asha, AdaptiveASHASearcher)
    assert (asha.divisor, asha.max_rungs, asha.mode, asha.time_metric) == (4.0, 5, "standard", None)
    timed = load_config({"searcher": {"name": "adaptive_asha", "metric": "m", "max_trials": 4,
                                      "time_metric": "batches", "max_time": 100}}).searcher
    assert isinstance(timed, AdaptiveASHASearcher) and timed.max_time == 100


def test_adaptive_asha_accepts_stop_once_and_warns_when_it_cannot_be_false() -> None:
    asha = {"name": "adaptive_asha", "metric": "m", "max_trials": 4, "max_length": 16}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # true is what this ASHA does: no warning
        searcher = load_config({"searcher": {**asha, "stop_once": True}}).searcher
    assert isinstance(searcher, AdaptiveASHASearcher) and searcher.stop_once is True
    with pytest.warns(ConfigWarning, match="stop_once: false.*never promoted later"):
        searcher = load_config({"searcher": {**asha, "stop_once": False}}).searcher
    assert isinstance(searcher, AdaptiveASHASearcher) and searcher.stop_once is False
    with pytest.raises(ConfigError, match="stop_once"):
        load_config({"searcher": {**asha, "stop_once": "sometimes"}})
    with pytest.raises(ConfigError, match="stop_once"):  # an ASHA key only
        load_config({"searcher": {"name": "random", "metric": "m", "max_trials": 2, "stop_once": True}})


def test_warm_start_keys_are_kept_and_the_trial_id_wins_over_the_uuid() -> None:
    base = {"name": "random", "metric": "loss", "max_trials": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)  # either key alone: no "ignored" warning any more
        assert load_config({"searcher": {**base, "source_trial_id": 3}}).searcher.source_trial_id == 3
        searcher = load_config({"searcher": {**base, "source_checkpoint_uuid": "0f1e"}}).searcher
    assert (searcher.source_trial_id, searcher.source_checkpoint_uuid) == (None, "0f1e")
    with pytest.warns(ConfigWarning, match="source_checkpoint_uuid '0f1e' is ignored: source_trial_id 3"):
        load_config({"searcher": {**base, "source_trial_id": 3, "source_checkpoint_uuid": "0f1e"}})
    for bad in ({"source_trial_id": 0}, {"source_trial_id": "3"}, {"source_checkpoint_uuid": ""}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            load_config({"searcher": {**base, **bad}})


def test_storage_forms() -> None:
    assert load_config({"searcher": SINGLE, "checkpoint_storage": "/tmp/x"}).checkpoint_storage == "/tmp/x"
    s3 = load_config({"searcher": SINGLE, "checkpoint_storage": {
        "type": "s3", "bucket": "b", "prefix": "p", "endpoint_url": "http://127.0.0.1:9000"}}).checkpoint_storage
    assert isinstance(s3, S3Storage) and (s3.bucket, s3.prefix, s3.save_trial_best) == ("b", "p", 1)
    gcs = load_config({"searcher": SINGLE, "checkpoint_storage": {"type": "gcs", "bucket": "b", "prefix": "p"}})
    assert isinstance(gcs.checkpoint_storage, GCSStorage) and gcs.checkpoint_storage.prefix == "p"
    azure = load_config({"searcher": SINGLE, "checkpoint_storage": {
        "type": "azure", "container": "c", "account_url": "https://a.blob.core.windows.net", "credential": "k"}})
    assert isinstance(azure.checkpoint_storage, AzureStorage) and azure.checkpoint_storage.credential == "k"
    d = load_config({"searcher": SINGLE, "checkpoint_storage": {"type": "directory", "container_path": "c"}})
    assert d.as_dict()["checkpoint_storage"]["container_path"] == "c"


def test_sources_yaml_text_path_and_parsed(tmp_path: Path) -> None:
    text = "searcher: {name: single, metric: loss}\nname: from-text\n"
    assert load_config(text).name == "from-text"
    (tmp_path / "c.yaml").write_text(text)
    assert load_config(str(tmp_path / "c.yaml")).name == "from-text"
    cfg = load_config(tmp_path / "c.yaml")
    assert load_config(cfg) is cfg


def test_nulls_mean_defaults_and_const_null_kept() -> None:
    cfg = load_config({"searcher": SINGLE, "description": None, "resources": None,
                       "hyperparameters": {"x": {"type": "const", "val": None}, "y": None}})
    assert cfg.description == "" and cfg.resources.slots_per_trial == 1
    assert sample_hparams(cfg.hyperparameters, random.Random(0)) == {"x": None, "y": None}


def test_frozen() -> None:
    cfg = load_config({"searcher": SINGLE})
    with pytest.raises(ValidationError):
        cfg.name = "other"
    with pytest.raises(ValidationError):
        cfg.resources.slots_per_trial = 4


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "full.yaml"
    path.write_text(FULL_YAML)
    cfg = load_config(path)
    plain = cfg.as_dict()
    assert json.loads(json.dumps(plain)) == plain
    assert plain["searcher"]["max_length"] == {"epochs": 3}
    assert plain["min_validation_period"] == {"batches": 200}
    assert load_config(plain) == cfg
    assert load_config(json.dumps(plain)) == cfg  # JSON is YAML
    minimal = load_config({"searcher": {**SINGLE, "max_length": 10}})
    assert load_config(minimal.as_dict()) == minimal


def test_pickle_copy_and_direct_construction() -> None:
    cfg = ExperimentConfig(
        searcher=SingleSearcher(metric="loss", max_length=Length(5, "batches")),
        hyperparameters={"lr": IntHP(minval=1, maxval=2), "g": {"a": 1}},
        checkpoint_storage=S3Storage(bucket="b"),
    )
    assert pickle.loads(pickle.dumps(cfg)) == cfg and copy.deepcopy(cfg) == cfg
    assert load_config(cfg.as_dict()) == cfg
    assert cfg.as_dict()["searcher"]["max_length"] == {"batches": 5}


def test_cluster_only_keys_warn_and_load() -> None:
    with pytest.warns(ConfigWarning, match="bind_mounts, workspace"):
        cfg = load_config({"searcher": SINGLE, "bind_mounts": [{"host_path": "/a"}], "workspace": "w",
                           "resources": {"slots_per_trial": 2}})
    assert cfg.resources.slots_per_trial == 2 and "bind_mounts" not in cfg.as_dict()
    with pytest.warns(ConfigWarning, match="resources key.*weight"):
        load_config({"searcher": SINGLE, "resources": {"weight": 2}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config({"searcher": SINGLE})


def test_settings_nothing_acts_on_warn_when_they_ask_for_something() -> None:
    asked = {"optimizations": {"mixed_precision": "O1", "gradient_compression": True, "tensor_fusion_threshold": 32,
                               "average_training_metrics": False},
             "resources": {"shm_size": "4G"}, "profiling": {"sync_timings": False}}
    with pytest.warns(ConfigWarning) as caught:
        cfg = load_config({"searcher": SINGLE, **asked})
    said = "\n".join(str(w.message) for w in caught)
    for key in ("optimizations.mixed_precision: 'O1' (Determined's apex AMP; for mixed precision call "
                "`context.experimental.use_amp()`", "optimizations.gradient_compression: True (a Horovod",
                "optimizations.tensor_fusion_threshold: 32", "optimizations.average_training_metrics: False",
                "resources.shm_size: '4G'", "profiling.sync_timings: False"):
        assert key in said, said
    assert cfg.optimizations.mixed_precision == "O1"  # kept: a ported config round-trips
    with warnings.catch_warnings():  # their defaults, as in a whole 0.38 config, ask for nothing
        warnings.simplefilter("error")
        load_config({"searcher": SINGLE, "optimizations": {"mixed_precision": "O0", "tensor_fusion_cycle_time": 1,
                                                           "average_training_metrics": True},
                     "resources": {"shm_size": None}, "profiling": {"sync_timings": True}})


def test_a_config_warning_points_at_the_line_that_loaded_the_config() -> None:
    with pytest.warns(ConfigWarning) as caught:
        load_config({"searcher": SINGLE, "bind_mounts": [], "optimizations": {"mixed_precision": "O2"}})
    assert [Path(w.filename).name for w in caught] == ["test_config.py", "test_config.py"]


def test_length_value_type() -> None:
    assert str(Length(5, "batches")) == "5 batches" and Length(7).as_config() == 7
    with pytest.raises(ValueError):
        Length(-1)
    with pytest.raises(ValueError):
        Length(1, "steps")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# bad input: every message names the dotted path and says how to fix it

BAD: list[tuple[str, dict[str, Any], str, list[str]]] = [
    ("unknown key", {"searcher": {**SINGLE, "metirc": "x"}}, "searcher.metirc",
     ["unknown key", "Did you mean 'metric'?"]),
    ("misplaced key", {"searcher": SINGLE, "slots_per_trial": 2}, "slots_per_trial",
     ["It is a valid key at: resources.slots_per_trial"]),
    ("other searcher's key", {"searcher": {**SINGLE, "name": "random", "max_trials": 2, "divisor": 3}},
     "searcher.divisor", ["for searcher 'adaptive_asha'"]),
    ("wrong type", {"searcher": {"name": "random", "metric": "m", "max_trials": "8"}},
     "searcher.max_trials", ["expected an integer, got '8'", "max_trials: 16"]),
    ("missing field", {"searcher": {"name": "single"}}, "searcher.metric",
     ["required key is missing", "metric: validation_loss"]),
    ("missing section", {"name": "x"}, "searcher", ["required key is missing", "searcher: {name: single"]),
    ("bad enum", {"searcher": SINGLE, "checkpoint_policy": "bets"}, "checkpoint_policy",
     ["'best', 'all', 'none'", "Did you mean 'best'?"]),
    ("bad searcher name", {"searcher": {"name": "asha", "metric": "m"}}, "searcher.name",
     ["single, grid, random, adaptive_asha"]),
    ("below minimum", {"searcher": SINGLE, "resources": {"slots_per_trial": 0}},
     "resources.slots_per_trial", ["must be >= 1, got 0"]),
    ("minval > maxval", {"searcher": SINGLE, "hyperparameters": {"lr": {"type": "double", "minval": 1, "maxval": 0.1}}},
     "hyperparameters.lr.maxval", ["minval (1.0) is greater than maxval (0.1)", "make minval <= maxval"]),
    ("empty categorical", {"searcher": SINGLE, "hyperparameters": {"g": {"o": {"type": "categorical", "vals": []}}}},
     "hyperparameters.g.o.vals", ["must not be empty", "vals: [32, 64, 128]"]),
    ("unknown hparam type", {"searcher": SINGLE, "hyperparameters": {"x": {"type": "doubel"}}},
     "hyperparameters.x.type", ["Did you mean 'double'?", "const, int, double, log, categorical"]),
    ("max_length two keys", {"searcher": {**SINGLE, "max_length": {"batches": 1, "epochs": 2}}},
     "searcher.max_length", ["exactly one key", "got 2 (batches, epochs)"]),
    ("max_length unknown unit", {"searcher": {**SINGLE, "max_length": {"steps": 1}}},
     "searcher.max_length", ["unknown length unit 'steps'", "batches, records, epochs"]),
    ("period without unit", {"searcher": SINGLE, "min_validation_period": 100},
     "min_validation_period", ["no unit", "{batches: 1000}"]),
    ("grid without count",
     {"searcher": {**SINGLE, "name": "grid"}, "hyperparameters": {"lr": {"type": "log", "minval": -3, "maxval": -1}}},
     "hyperparameters.lr.count", ["grid searcher needs `count`", "'lr'"]),
    ("asha without length", {"searcher": {**SINGLE, "name": "adaptive_asha", "max_trials": 4}},
     "searcher.max_length", ["adaptive_asha needs a length"]),
    ("unknown storage type", {"searcher": SINGLE, "checkpoint_storage": {"type": "hdfs", "bucket": "b"}},
     "checkpoint_storage.type", ["shared_fs, directory, s3, gcs, azure"]),
    ("azure with two ways in", {"searcher": SINGLE, "checkpoint_storage": {
        "type": "azure", "container": "c", "connection_string": "x", "account_url": "https://a"}},
     "checkpoint_storage", ["exactly one of connection_string and account_url"]),
    ("storage missing field", {"searcher": SINGLE, "checkpoint_storage": {"type": "s3"}},
     "checkpoint_storage.bucket", ["required key is missing", "bucket: my-checkpoints"]),
    ("seed out of range", {"searcher": SINGLE, "reproducibility": {"experiment_seed": 2**31}},
     "reproducibility.experiment_seed", ["must be <= 2147483647"]),
    ("bool as string", {"searcher": SINGLE, "debug": "yes"}, "debug", ["expected true or false"]),
    ("label type", {"searcher": SINGLE, "labels": ["a", 3]}, "labels[1]", ["expected a string"]),
    ("bad entrypoint", {"searcher": SINGLE, "entrypoint": 5}, "entrypoint", ["model_def:MyTrial"]),
    ("not JSON", {"searcher": SINGLE, "data": {"f": object()}}, "data", ["not JSON-serialisable"]),
    ("profiling range", {"searcher": SINGLE, "profiling": {"begin_on_batch": 5, "end_after_batch": 2}},
     "profiling.end_after_batch", ["make it >= begin_on_batch"]),
    ("non-string key", {"searcher": SINGLE, "hyperparameters": {1: 2}}, "hyperparameters.1",
     ["keys must be strings, got 1", "quote the key"]),
    ("unknown key set to null", {"searcher": SINGLE, "notes": None}, "notes", ["unknown key"]),
    ("empty name", {"searcher": SINGLE, "name": ""}, "name", ["must not be empty", "name: mnist-const"]),
    ("time_metric alone", {"searcher": {**SINGLE, "name": "adaptive_asha", "max_trials": 2, "time_metric": "t"}},
     "searcher.max_time", ["go together"]),
]


@pytest.mark.parametrize(("kind", "raw", "path", "hints"), BAD, ids=[b[0] for b in BAD])
def test_bad_input(kind: str, raw: dict[str, Any], path: str, hints: list[str]) -> None:
    message = _error(raw)
    assert f"  - {path}: " in message, message
    for hint in hints:
        assert hint in message, message


def test_every_problem_is_listed() -> None:
    message = _error({"searcher": {"name": "random", "metirc": "m"}, "max_restarts": -1, "debug": 1})
    assert "(5 problems)" in message
    for path in ("searcher.metric", "searcher.metirc", "searcher.max_trials", "max_restarts", "debug"):
        assert f"  - {path}: " in message


def test_no_raw_pydantic_text() -> None:
    message = _error({"searcher": {"name": "single", "metric": 3}, "resources": {"slots_per_trial": "2"}})
    assert "validation error" not in message and "pydantic" not in message and "Input should" not in message


def test_yaml_syntax_error_has_line() -> None:
    message = _error("searcher:\n  name: single\n  metric: [loss\nname: x\n")
    assert "YAML syntax error at line" in message and "indentation" in message


def test_yaml_duplicate_key() -> None:
    message = _error("searcher:\n  name: single\n  metric: a\n  metric: b\n")
    assert "duplicate key 'metric' at line 4 (first at line 3)" in message


def test_missing_file(tmp_path: Path) -> None:
    message = _error(str(tmp_path / "nope.yaml"))
    assert "nope.yaml' does not exist" in message
    assert "is a directory" in _error(tmp_path)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string: [\n", ""])
def test_top_level_not_mapping(text: str, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    message = _error(path)
    assert "c.yaml" in message
    assert ("top level must be a mapping" in message) or ("YAML syntax error" in message)


def test_unsupported_source_type() -> None:
    assert "pass a path to a YAML file" in _error(42)


# ---------------------------------------------------------------------------------------------
# hyperparameter sampling

SPACE: dict[str, Any] = {
    "n": {"type": "int", "minval": 2, "maxval": 5},
    "d": {"type": "double", "minval": 0.5, "maxval": 1.5},
    "lg": {"type": "log", "base": 2, "minval": -3, "maxval": 3},
    "c": {"type": "categorical", "vals": ["a", [1, 2], {"k": 1}]},
    "k": {"type": "const", "val": {"x": 1}},
    "plain": [1, 2, 3],
    "group": {"inner": {"type": "int", "minval": 0, "maxval": 1}, "fixed": "yes"},
}


def test_sampling_is_deterministic_and_in_range() -> None:
    first = [sample_hparams(SPACE, random.Random(seed)) for seed in range(200)]
    again = [sample_hparams(SPACE, random.Random(seed)) for seed in range(200)]
    assert first == again
    for hp in first:
        assert isinstance(hp["n"], int) and 2 <= hp["n"] <= 5
        assert 0.5 <= hp["d"] <= 1.5
        assert 2**-3 <= hp["lg"] <= 2**3 and math.log2(hp["lg"]) == pytest.approx(math.log2(hp["lg"]))
        assert hp["c"] in ("a", [1, 2], {"k": 1})
        assert hp["k"] == {"x": 1} and hp["plain"] == [1, 2, 3]
        assert hp["group"]["fixed"] == "yes" and hp["group"]["inner"] in (0, 1)
    assert {hp["n"] for hp in first} == {2, 3, 4, 5}  # inclusive ends
    assert len({hp["d"] for hp in first}) > 150
    assert {repr(hp["c"]) for hp in first} == {"'a'", "[1, 2]", "{'k': 1}"}


def test_sampling_from_parsed_config_and_copies() -> None:
    cfg = load_config({"searcher": SINGLE, "hyperparameters": SPACE})
    a = sample_hparams(cfg.hyperparameters, random.Random(3))
    assert a == sample_hparams(SPACE, random.Random(3))
    a["k"]["x"] = 99
    a["plain"].append(4)
    assert sample_hparams(cfg.hyperparameters, random.Random(3))["k"] == {"x": 1}
    assert cfg.hyperparameters["plain"] == [1, 2, 3]


def test_sampling_bad_space_is_config_error() -> None:
    with pytest.raises(ConfigError, match=r"hyperparameters\.x\.maxval: required key is missing"):
        sample_hparams({"x": {"type": "int", "minval": 1}}, random.Random(0))


# ---------------------------------------------------------------------------------------------
# grid


def test_grid_values_and_count() -> None:
    space = {
        "i": {"type": "int", "minval": 1, "maxval": 4, "count": 3},
        "lr": {"type": "log", "minval": -3, "maxval": -1, "count": 3},
        "c": {"type": "categorical", "vals": ["x", "y"]},
        "k": {"type": "const", "val": 5},
        "p": "plain",
    }
    points = grid_points(space)
    assert len(points) == 3 * 3 * 2
    assert sorted({p["i"] for p in points}) == [1, 3, 4]  # 1, 2.5 -> 3 (half away from zero), 4
    assert sorted({p["lr"] for p in points}) == pytest.approx([1e-3, 1e-2, 1e-1])
    assert {p["c"] for p in points} == {"x", "y"} and {p["k"] for p in points} == {5}
    assert all(p["p"] == "plain" for p in points)
    assert points[0] == {"i": 1, "lr": pytest.approx(1e-3), "c": "x", "k": 5, "p": "plain"}
    assert [p["i"] for p in points[:6]] == [1] * 6  # the first hyperparameter varies slowest
    assert list(points[0]) == ["i", "lr", "c", "k", "p"]


def test_grid_int_rounding_dedup_and_clamp() -> None:
    assert [p["n"] for p in grid_points({"n": {"type": "int", "minval": 0, "maxval": 2, "count": 10}})] == [0, 1, 2]
    assert [p["n"] for p in grid_points({"n": {"type": "int", "minval": 0, "maxval": 10, "count": 4}})] == [0, 3, 7, 10]
    assert [p["n"] for p in grid_points({"n": {"type": "int", "minval": 1, "maxval": 4, "count": 1}})] == [3]
    assert [p["n"] for p in grid_points({"n": {"type": "int", "minval": 5, "maxval": 5, "count": 3}})] == [5]


def test_grid_double_and_log_endpoints() -> None:
    d = [p["d"] for p in grid_points({"d": {"type": "double", "minval": 0, "maxval": 1, "count": 5}})]
    assert d == pytest.approx([0, 0.25, 0.5, 0.75, 1])
    assert [p["d"] for p in grid_points({"d": {"type": "double", "minval": 0, "maxval": 1, "count": 1}})] == [0.5]
    lg = [p["x"] for p in grid_points({"x": {"type": "log", "base": 2, "minval": 0, "maxval": 4, "count": 3}})]
    assert lg == pytest.approx([1, 4, 16])


def test_grid_nested_and_empty() -> None:
    points = grid_points({"opt": {"lr": {"type": "categorical", "vals": [1, 2]}, "m": 0.9}, "b": 3})
    assert points == [{"opt": {"lr": 1, "m": 0.9}, "b": 3}, {"opt": {"lr": 2, "m": 0.9}, "b": 3}]
    assert grid_points({}) == [{}]
    assert grid_points({"g": {}}) == [{"g": {}}]


def test_grid_needs_count_naming_every_hparam() -> None:
    with pytest.raises(ConfigError) as info:
        grid_points({"a": {"type": "int", "minval": 0, "maxval": 3},
                     "g": {"b": {"type": "double", "minval": 0, "maxval": 1}}})
    message = str(info.value)
    assert "hyperparameters.a.count" in message and "hyperparameters.g.b.count" in message
    assert "'g.b'" in message and "count: 4" in message


def test_a_mesh_fills_dp_shard_with_the_slots_left_and_its_product_must_be_the_slots() -> None:
    def mesh(slots: int, **sizes: int) -> Any:
        return load_config({"searcher": SINGLE, "resources": {"slots_per_trial": slots, "mesh": sizes}}).resources.mesh

    assert load_config({"searcher": SINGLE, "resources": {"slots_per_trial": 4}}).resources.mesh is None
    assert mesh(4, tp=2).shape == (1, 2, 2) and mesh(4).shape == (1, 4, 1)
    assert mesh(8, dp_replicate=2, tp=2).shape == (2, 2, 2) and mesh(2, dp_replicate=2).shape == (2, 1, 1)
    for slots, sizes, said in ((4, {"dp_shard": 3, "tp": 2}, "dp_shard 3"), (4, {"tp": 3}, "dp_shard (the rest)"),
                               (2, {"dp_replicate": 2, "tp": 2}, "tp 2")):
        with pytest.raises(ConfigError) as err:
            mesh(slots, **sizes)
        assert "resources.mesh" in str(err.value) and said in str(err.value)
        assert "must equal slots_per_trial" in str(err.value) and f"slots_per_trial ({slots})" in str(err.value)
    with pytest.raises(ConfigError, match="resources.mesh.tp"):
        mesh(2, tp=0)
