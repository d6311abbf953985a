"""Issue 8, items 1-5: what a Determined user hits first. A bare run enforces no metric; a named metric
the trial never returns fails at the first validation whatever the checkpoint policy; test_mode; the names tutorials import; ranks
under wrap_rank find each other; every key of the 0.38 config schema is accepted."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from trials_pytorch import LinearTrial, config, fit

import determined_trials as det
from determined_trials import pytorch
from determined_trials.config import ConfigWarning, load_config
from determined_trials.config._det_keys import DETERMINED_KEYS
from determined_trials.errors import ConfigError
from determined_trials.experiment._launch import TrialLaunch, trial_environment
from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)


class _ValLossTrial(LinearTrial):
    """Returns `val_loss`, not the `validation_loss` a default searcher would name."""

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        _, x, y = batch
        return {"val_loss": nn.functional.mse_loss(self.model(x), y)}


def _bare_fit(tmp_path: Path, **fit_kwargs: Any) -> tuple[Any, Any]:
    hparams = {"global_batch_size": 2, "lr": 0.1}
    with pytorch.init(hparams=hparams, run_dir=tmp_path) as context:
        trial = _ValLossTrial(context)
        pytorch.Trainer(trial, context).fit(show_progress=False, **fit_kwargs)
        core = context._core
        assert core is not None
        return trial, core.store.checkpoints(trial_id=context.get_trial_id())


# -- item 1: no invented searcher metric ------------------------------------------------------------


def test_bare_run_needs_no_searcher_metric_and_best_keeps_every_validated_checkpoint(tmp_path: Path) -> None:
    trial, checkpoints = _bare_fit(tmp_path, max_length=Batch(4), validation_period=Batch(2))
    validations = [e for e in trial.events if e[0] == "validation_end"]
    assert [sorted(e[1]) for e in validations] == [["val_loss"], ["val_loss"]]
    # checkpoint_policy="best" with no metric to rank by: every validation is checkpointed (as "all")
    assert [c.steps_completed for c in checkpoints] == [2, 4]


def test_bare_run_without_max_length_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"fit\(\) needs max_length"):
        _bare_fit(tmp_path)


def test_exp_conf_without_searcher_runs_like_a_bare_run(tmp_path: Path) -> None:
    conf = {"hyperparameters": {"global_batch_size": 2, "lr": 0.1}}
    trial, _, info = fit(_ValLossTrial, conf, tmp_path, max_length=Batch(2), validation_period=Batch(2))
    assert [c.steps_completed for c in info["checkpoints"]] == [2]


_MISSING = (r"Search method is configured to use metric 'validation_loss' but model definition returned "
            r"validation metrics \['val_loss'\]")


@pytest.mark.parametrize("policy", ["best", "all", "none"])
def test_named_metric_never_returned_fails_at_the_first_validation(tmp_path: Path, policy: str) -> None:
    """Whatever the checkpoint policy (Determined's error and words)."""
    trial_box: list[Any] = []

    def build(context: pytorch.PyTorchTrialContext) -> Any:
        trial_box.append(_ValLossTrial(context))
        return trial_box[0]

    with pytest.raises(KeyError, match=_MISSING):
        fit(build, config({"global_batch_size": 2}), tmp_path, max_length=Batch(40), validation_period=Batch(2),
            checkpoint_policy=policy)
    assert [e[1] for e in trial_box[0].events if e[0] == "batch"] == [0, 1]  # stopped at the first validation


def test_a_config_made_up_by_core_init_enforces_no_metric(tmp_path: Path) -> None:
    """No exp_conf, no hparams, no launcher: ``core.init()`` makes the config up, so its searcher (metric
    validation_loss) is not the user's and is not enforced, in ``init()`` or a context built on it."""
    with pytorch.init(run_dir=tmp_path / "init") as context:
        assert context._searcher_metric_named is False
    with det.core.init(run_dir=tmp_path / "core") as core_context:
        context = pytorch.PyTorchTrialContext(core_context=core_context, hparams={"global_batch_size": 2, "lr": 0.1})
        trial = _ValLossTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=Batch(4), validation_period=Batch(2), checkpoint_policy="all",
                                            show_progress=False)
    assert [sorted(e[1]) for e in trial.events if e[0] == "validation_end"] == [["val_loss"], ["val_loss"]]
    with det.core.init(run_dir=tmp_path / "named", config=config({"global_batch_size": 2})) as core_context:
        assert pytorch.PyTorchTrialContext(core_context=core_context)._searcher_metric_named is True


# -- item 2: test_mode ---------------------------------------------------------------------------------


def test_test_mode_trains_one_batch_validates_one_batch_and_checkpoints(tmp_path: Path) -> None:
    trial, _, info = fit(LinearTrial, config(), tmp_path, max_length=Batch(5), test_mode=True)
    assert [e[1] for e in trial.events if e[0] == "batch"] == [0]
    assert sum(e[0] == "validation_end" for e in trial.events) == 1
    assert [c.steps_completed for c in info["checkpoints"]] == [1]


# -- item 3: names used at import time ------------------------------------------------------------------


def test_log_format_and_torch_data_exist() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    assert logging.Formatter(det.LOG_FORMAT).format(record).endswith("x: hello")
    assert det.pytorch.TorchData is pytorch.TorchData
    assert torch.Tensor in pytorch.TorchData.__args__  # type: ignore[attr-defined]


def test_import_from_path_imports_from_the_folder_and_forgets_it(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "dropin_model_def.py").write_text("WHERE = 'a'\n")
    (tmp_path / "b" / "dropin_model_def.py").write_text("WHERE = 'b'\n")
    with det.import_from_path(tmp_path / "a"):
        import dropin_model_def as first
    with det.import_from_path(str(tmp_path / "b")):
        import dropin_model_def as second  # not the cached one of folder a
    assert (first.WHERE, second.WHERE) == ("a", "b")
    assert "dropin_model_def" not in sys.modules and str(tmp_path / "a") not in sys.path
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        with det.import_from_path(tmp_path / "missing"):
            pass


def test_module_level_to_device_moves_nested_data_and_warns_once_per_type(caplog: pytest.LogCaptureFixture) -> None:
    warned: set[type] = set()
    data = {"x": np.ones(3, dtype=np.float32), "pair": (torch.zeros(2), "label")}
    moved = pytorch.to_device(data, "cpu", warned)
    assert isinstance(moved["x"], torch.Tensor) and moved["x"].tolist() == [1.0, 1.0, 1.0]
    assert moved["pair"][1] == "label" and warned == {str}
    assert pytorch.to_device(torch.ones(1), torch.device("cpu")).device.type == "cpu"


def test_adapt_batch_sampler_repeats_then_shards_then_skips() -> None:
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(10)), 2, False)
    # the reference's numbers: 10 items, 5 batches, 3 ranks, repeat, skip 2
    expected = {0: [[2, 3], [8, 9], [4, 5], [0, 1], [6, 7]], 1: [[4, 5], [0, 1], [6, 7], [2, 3], [8, 9]],
                2: [[6, 7], [2, 3], [8, 9], [4, 5], [0, 1]]}
    for rank, want in expected.items():
        adapted = pytorch.adapt_batch_sampler(batches, repeat=True, skip=2, num_replicas=3, rank=rank)
        it = iter(adapted)
        assert [next(it) for _ in range(5)] == want
    assert list(pytorch.adapt_batch_sampler(batches)) == list(batches)
    with pytest.raises(ValueError, match="skip must be an integer >= 0"):
        pytorch.adapt_batch_sampler(batches, skip=-1)


def test_cluster_info_slot_facts(tmp_path: Path) -> None:
    launch = TrialLaunch(experiment_id=1, trial_id=2, hparams={}, seed=3,
                         config={"resources": {"slots_per_trial": 3}}, length=10, latest_checkpoint=None,
                         steps_completed=0, run_id=1)
    info = launch.cluster_info(tmp_path)
    assert (info.slot_ids, info.container_slot_counts, info.gpu_uuids) == ([0, 1, 2], [3], [])


def test_wrap_lr_scheduler_by_keyword(tmp_path: Path) -> None:
    with pytorch.init(hparams={"lr": 0.1}, run_dir=tmp_path) as context:
        model = context.wrap_model(nn.Linear(1, 1))
        optimizer = context.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        got = context.wrap_lr_scheduler(lr_scheduler=scheduler, step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
                                        frequency=2)
        assert got is scheduler and context.lr_schedulers[0].frequency == 2


# -- item 4: ranks find each other however they are wrapped ----------------------------------------------

_ALLGATHER = textwrap.dedent("""
    from determined_trials import core
    dist = core.DistributedContext.from_torch_distributed()
    print("gathered", dist.allgather(dist.get_rank()), flush=True)
    dist.close()
""")


@pytest.mark.slow
def test_ranks_started_under_wrap_rank_by_one_launcher_meet() -> None:
    """No DET_JOB_ID and no MASTER_ADDR: the key comes from the launcher, not from each rank's wrap_rank."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("DET_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "DET_CORE_PORT")}
    base.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", GROUP_RANK="0", GROUP_WORLD_SIZE="1",
                DET_COLLECTIVE_TIMEOUT="60")
    procs = [
        subprocess.Popen([sys.executable, "-m", "determined_trials.launch.wrap_rank", "RANK", "--",
                          sys.executable, "-c", _ALLGATHER],
                         env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for r in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert all("gathered [0, 1]" in out for out in outputs), outputs


def test_experiment_runner_hands_each_trial_process_its_own_job_id(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DET_JOB_ID", "outer-job")
    launch = TrialLaunch(experiment_id=1, trial_id=2, hparams={}, seed=3, config={}, length=10,
                         latest_checkpoint=None, steps_completed=0, run_id=1)
    envs = [trial_environment(launch, run_dir=tmp_path, info_path=tmp_path / f"info{i}.json",
                              config_path=tmp_path / "c.yaml") for i in range(2)]
    ids = [env["DET_JOB_ID"] for env in envs]
    assert ids[0].startswith("trial-1.2.1-") and ids[0] != ids[1] and "outer-job" not in ids


# -- item 5: every key of the 0.38 experiment-config schema ----------------------------------------------


def _with_key(section: str, key: str) -> dict[str, Any]:
    conf: dict[str, Any] = {"searcher": {"name": "single", "metric": "loss", "max_length": 10}}
    if section == "experiment":
        if key != "searcher":
            conf[key] = None  # null: "use the default", valid for every 0.38 key
        return conf
    where, _, kind = section.partition(".")
    if where == "searcher":
        extra: dict[str, Any] = {"max_trials": 2} if kind in ("random", "adaptive_asha") else {}
        if kind == "pbt":  # its required keys; max_length 10 = num_rounds x length_per_round
            extra = {"population_size": 2, "num_rounds": 2, "length_per_round": 5,
                     "replace_function": {"truncate_fraction": 0.5},
                     "explore_function": {"resample_probability": 0.2, "perturb_factor": 0.2}}
        conf["searcher"] = {"name": kind, "metric": "loss", "max_length": 10, **extra}
        conf["searcher"].setdefault(key, None)
        return conf
    if where == "checkpoint_storage":
        required = {"shared_fs": {"host_path": "/tmp"}, "directory": {"container_path": "/tmp"},
                    "s3": {"bucket": "b"}, "gcs": {"bucket": "b"},
                    "azure": {"container": "c", "connection_string": "UseDevelopmentStorage=true"}}[kind]
        conf["checkpoint_storage"] = {"type": kind, **required}
        conf["checkpoint_storage"].setdefault(key, None)
        return conf
    conf[section] = {key: None}
    return conf


@pytest.mark.parametrize(("section", "key"), [(s, k) for s, keys in DETERMINED_KEYS.items() for k in sorted(keys)])
def test_every_determined_038_key_is_accepted(section: str, key: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(_with_key(section, key))
    warned = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert all(key in message for message in warned)  # a warning, if any, names this key only


def test_determined_keys_with_values_are_warned_about_and_typos_still_fail() -> None:
    conf = {
        "searcher": {"name": "adaptive_asha", "metric": "loss", "max_length": 100, "max_trials": 4,
                     "source_trial_id": 7, "source_checkpoint_uuid": "0f1e", "bracket_rungs": [1, 2]},
        "checkpoint_storage": {"type": "shared_fs", "host_path": "/tmp", "propagation": "rprivate"},
        "resources": {"slots": 2, "devices": [], "is_single_node": True},
        "optimizations": {"grad_updates_size_file": "x"},
        "workspace": "ws", "project": "p", "log_policies": [], "security": {"kerberos": {"config_file": "f"}},
    }
    with pytest.warns(ConfigWarning) as caught:
        parsed = load_config(conf)
    text = " ".join(str(w.message) for w in caught)
    for key in ("source_trial_id", "source_checkpoint_uuid", "bracket_rungs", "propagation", "slots", "devices",
                "grad_updates_size_file", "workspace", "log_policies", "security"):
        assert key in text
    assert parsed.searcher.max_trials == 4
    with pytest.raises(ConfigError, match="source_trial_idd"):
        load_config({"searcher": {"name": "single", "metric": "loss", "source_trial_idd": 7}})


def test_import_from_path_keeps_libraries_and_restores_shadowed_modules(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "dropin_shadow.py").write_text("WHERE = 'own'\n")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "dropin_shadow.py").write_text("import dropin_lib\nWHERE = 'code'\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "dropin_lib.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.syspath_prepend(str(tmp_path / "own"))
    import dropin_shadow as own

    with det.import_from_path(tmp_path / "code"):
        import dropin_shadow as from_code
    assert (own.WHERE, from_code.WHERE) == ("own", "code")
    assert sys.modules["dropin_shadow"] is own  # the module in use is back
    assert "dropin_lib" in sys.modules  # a library the folder's code imported stays imported
    for name in ("dropin_shadow", "dropin_lib"):
        monkeypatch.delitem(sys.modules, name)
