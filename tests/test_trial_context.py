"""TrialContext: from_config, hyperparameter access, ids and seeds, batch sizes, distributed."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from determined_trials import TrialContext
from determined_trials.config import load_config
from determined_trials.errors import ConfigError

CONFIG: dict[str, Any] = {
    "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 10}},
    "hyperparameters": {
        "global_batch_size": 32,
        "lr": {"type": "log", "minval": -4, "maxval": -1},
        "layers": {"type": "int", "minval": 1, "maxval": 3},
        "opt": {"name": {"type": "categorical", "vals": ["sgd", "adam"]}, "momentum": 0.9},
    },
    "reproducibility": {"experiment_seed": 7},
    "data": {"path": "/data", "nested": {"a": 1}},
}


class _FakeDistributed:
    def __init__(self, **kwargs: int) -> None:
        self.__dict__.update(kwargs)

    def get_size(self) -> int:
        return int(self.__dict__["size"])


@pytest.fixture
def distributed_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use the real core._distributed when it exists, else a small fake with the same constructor."""
    try:
        import determined_trials.core._distributed  # noqa: F401
    except Exception:  # noqa: BLE001 - not written yet (or its package is mid-edit): use the fake
        fake = types.ModuleType("determined_trials.core._distributed")
        fake.DistributedContext = _FakeDistributed  # type: ignore[attr-defined]
        if "determined_trials.core" not in sys.modules:
            monkeypatch.setitem(sys.modules, "determined_trials.core", types.ModuleType("determined_trials.core"))
        monkeypatch.setitem(sys.modules, "determined_trials.core._distributed", fake)


def _context(hparams: dict[str, Any], slots: int = 1) -> TrialContext:
    cfg = load_config({"searcher": CONFIG["searcher"], "resources": {"slots_per_trial": slots}})
    return TrialContext(config=cfg, hparams=hparams, trial_seed=1)


def test_from_config_samples_seeded_hparams() -> None:
    ctx = TrialContext.from_config(CONFIG)
    again = TrialContext.from_config(CONFIG)
    hp = ctx.get_hparams()
    assert hp == again.get_hparams()
    assert hp["global_batch_size"] == 32 and 1e-4 <= hp["lr"] <= 1e-1 and hp["layers"] in (1, 2, 3)
    assert hp["opt"]["name"] in ("sgd", "adam") and hp["opt"]["momentum"] == 0.9
    assert ctx.get_trial_seed() == 7
    assert (ctx.get_trial_id(), ctx.get_experiment_id()) == (0, 0)
    other_seed = {**CONFIG, "reproducibility": {"experiment_seed": 8}}
    samples = {TrialContext.from_config({**other_seed, "reproducibility": {"experiment_seed": s}})
               .get_hparam("lr") for s in range(5)}
    assert len(samples) == 5


def test_from_config_defaults_seed_zero_and_searcher() -> None:
    ctx = TrialContext.from_config({"hyperparameters": {"x": 1}})
    assert ctx.get_trial_seed() == 0 and ctx.get_hparam("x") == 1
    searcher = ctx.get_experiment_config()["searcher"]
    assert searcher["name"] == "single" and searcher["max_length"] == {"batches": 100}


def test_from_config_accepts_yaml_path_and_parsed(tmp_path: Any) -> None:
    path = tmp_path / "const.yaml"
    path.write_text("hyperparameters: {global_batch_size: 8}\n")
    assert TrialContext.from_config(path).get_global_batch_size() == 8
    assert TrialContext.from_config(str(path)).get_hparams() == {"global_batch_size": 8}
    parsed = load_config(CONFIG)
    assert TrialContext.from_config(parsed).config is parsed


def test_from_config_reports_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"hyperparameters\.lr\.maxval"):
        TrialContext.from_config({"hyperparameters": {"lr": {"type": "int", "minval": 3, "maxval": 1}}})


def test_subclass_from_config_returns_subclass() -> None:
    class MyContext(TrialContext):
        pass

    assert type(MyContext.from_config(CONFIG)) is MyContext


def test_accessors_return_copies() -> None:
    ctx = TrialContext.from_config(CONFIG)
    ctx.get_hparams()["opt"]["momentum"] = 0.0
    assert ctx.get_hparam("opt")["momentum"] == 0.9
    data = ctx.get_data_config()
    assert data == {"path": "/data", "nested": {"a": 1}}
    data["nested"]["a"] = 2
    assert ctx.get_data_config()["nested"]["a"] == 1
    exp = ctx.get_experiment_config()
    assert exp["reproducibility"]["experiment_seed"] == 7 and exp["data"]["path"] == "/data"
    exp["name"] = "changed"
    assert ctx.get_experiment_config()["name"] == "experiment"


def test_get_hparam_missing_lists_names() -> None:
    ctx = TrialContext.from_config(CONFIG)
    with pytest.raises(KeyError) as info:
        ctx.get_hparam("lrr")
    message = str(info.value)
    assert "'lrr' is not defined" in message and "Did you mean 'lr'?" in message
    assert "global_batch_size, layers, lr, opt" in message


def test_batch_sizes() -> None:
    ctx = _context({"global_batch_size": 64}, slots=4)
    assert (ctx.get_global_batch_size(), ctx.get_per_slot_batch_size()) == (64, 16)
    assert _context({"global_batch_size": 5}).get_per_slot_batch_size() == 5


def test_batch_size_missing() -> None:
    with pytest.raises(ConfigError, match="'global_batch_size' is not set.*global_batch_size: 64"):
        _context({"lr": 0.1}).get_per_slot_batch_size()


def test_batch_size_smaller_than_slots() -> None:
    with pytest.raises(ConfigError, match=r"\(2\) is smaller than the number of slots \(4\)"):
        _context({"global_batch_size": 2}, slots=4).get_global_batch_size()


def test_batch_size_not_divisible_says_effective_sizes() -> None:
    with pytest.raises(ConfigError) as info:
        _context({"global_batch_size": 100}, slots=3).get_per_slot_batch_size()
    message = str(info.value)
    assert "not divisible by the number of slots (3)" in message
    assert "each slot would get 33 records" in message and "effective global batch size would be 99" in message
    assert "use global_batch_size 99 or 102" in message


@pytest.mark.parametrize("value", [0, -4, 3.5, "64", True])
def test_batch_size_bad_value(value: Any) -> None:
    with pytest.raises(ConfigError, match="must be a positive integer"):
        _context({"global_batch_size": value}).get_global_batch_size()


def test_distributed_is_size_one(distributed_module: None) -> None:
    dist = TrialContext.from_config(CONFIG).distributed
    assert dist.get_size() == 1
    assert (dist.rank, dist.size, dist.local_rank, dist.local_size, dist.cross_rank, dist.cross_size) == (
        0, 1, 0, 1, 0, 1)


def test_given_distributed_is_kept() -> None:
    marker: Any = _FakeDistributed(rank=1, size=2)
    ctx = TrialContext(config=load_config(CONFIG), hparams={}, trial_seed=3, trial_id=4,
                       experiment_id=5, distributed=marker)
    assert ctx.distributed is marker
    assert (ctx.get_trial_seed(), ctx.get_trial_id(), ctx.get_experiment_id()) == (3, 4, 5)


def test_constructor_needs_parsed_config() -> None:
    with pytest.raises(TypeError, match="load_config"):
        TrialContext(config=CONFIG, hparams={}, trial_seed=0)  # type: ignore[arg-type]


def test_a_family_method_on_the_bare_context_names_the_family_context_to_build() -> None:
    ctx = TrialContext.from_config(CONFIG)
    with pytest.raises(AttributeError, match=r"'wrap_model'.*`det\.pytorch\.PyTorchTrialContext\.from_config\(config\)` "
                                             r"or `det\.keras\.TFKerasTrialContext\.from_config\(config\)`"):
        ctx.wrap_model  # noqa: B018
    with pytest.raises(AttributeError, match=r"`det\.pytorch\.deepspeed\.DeepSpeedTrialContext\.from_config"):
        ctx.wrap_model_engine  # noqa: B018
    with pytest.raises(AttributeError, match=r"^'TrialContext' object has no attribute 'no_such_thing'$"):
        ctx.no_such_thing  # noqa: B018
    assert getattr(ctx, "wrap_optimizer", None) is None and not hasattr(ctx, "_not_set")


def _family_contexts(with_keras: bool) -> dict[str, type]:
    from determined_trials import deepspeed, pytorch

    found = {"det.pytorch.PyTorchTrialContext": pytorch.PyTorchTrialContext,
             "det.pytorch.deepspeed.DeepSpeedTrialContext": deepspeed.DeepSpeedTrialContext}
    if with_keras:
        from determined_trials import keras

        found["det.keras.TFKerasTrialContext"] = keras.TFKerasTrialContext
    return found


@pytest.mark.parametrize("with_keras", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_the_family_only_names_are_what_each_family_context_has(with_keras: bool) -> None:
    from determined_trials._trial_context import _FAMILY_ONLY

    contexts = _family_contexts(with_keras)
    for name, families in _FAMILY_ONLY.items():
        assert not hasattr(TrialContext, name), name
        for family, cls in contexts.items():
            assert hasattr(cls, name) == (family in families), (name, family)
    pytorch_ctx = contexts["det.pytorch.PyTorchTrialContext"].from_config(CONFIG)  # type: ignore[attr-defined]
    assert callable(pytorch_ctx.wrap_model)


class _FamilyContext(TrialContext):
    """A family's context in miniature: the constructor preamble every family's context starts with."""

    def __init__(self, core_context: Any, **identity: Any) -> None:
        self._init_identity(core_context, identity)


def test_a_contexts_trial_is_fixed_once(tmp_path: Any) -> None:
    """The ids and seed are read-only, from construction (given) or from the Core API context's trial, which is
    settled once: no part of either context can be pointed at another trial afterwards."""
    import dataclasses

    import determined_trials as det

    bare = TrialContext.from_config(CONFIG)
    for name in ("_trial_id", "_trial_seed", "_experiment_id"):
        with pytest.raises(AttributeError):
            setattr(bare, name, 5)
    assert (bare.get_trial_seed(), bare.get_trial_id()) == (7, 0)
    with det.core.init(config=CONFIG, run_dir=tmp_path) as core:
        context = _FamilyContext(core)
        given = _FamilyContext(core, trial_id=42)
        trial = core.info.trial
        assert (context.get_trial_id(), context.get_experiment_id(), context.get_trial_seed()) == \
            (trial.trial_id, trial.experiment_id, trial.trial_seed)
        assert (given.get_trial_id(), given.get_trial_seed()) == (42, trial.trial_seed)
        for name in ("_trial_id", "_trial_seed", "_experiment_id"):
            with pytest.raises(AttributeError):
                setattr(context, name, 5)
        for part in ("info", "train", "checkpoint", "searcher", "profiler"):
            with pytest.raises(AttributeError):
                setattr(core, part, None)
        assert not hasattr(core, "_retarget")
        other = dataclasses.replace(trial, trial_id=trial.trial_id + 1)
        with pytest.raises(RuntimeError, match="cannot be settled again"):
            core._settle(other, None)
        assert core.info.trial == trial and context.get_trial_id() == trial.trial_id


def test_a_meshs_tensor_parallel_ranks_share_a_batch() -> None:
    cfg = load_config({"searcher": CONFIG["searcher"], "resources": {"slots_per_trial": 4, "mesh": {"tp": 2}}})
    ctx = TrialContext(config=cfg, hparams={"global_batch_size": 64}, trial_seed=1)
    assert (ctx.get_global_batch_size(), ctx.get_per_slot_batch_size()) == (64, 32)  # 2 data-parallel ranks


def test_a_mesh_is_refused_by_a_deepspeed_trial() -> None:
    from determined_trials.pytorch.deepspeed import DeepSpeedTrialContext

    conf = {**CONFIG, "resources": {"slots_per_trial": 2, "mesh": {"dp_replicate": 2}}}
    with pytest.raises(ConfigError, match="resources.mesh is set, but a DeepSpeedTrialContext has no device mesh"):
        DeepSpeedTrialContext.from_config(conf)
