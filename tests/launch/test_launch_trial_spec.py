"""``--trial`` specs and the harness: every error a person can act on, sibling imports from the context
directory, config resolution; and the launcher's command line (splitting, command, early errors)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from determined_trials.launch import TrialSpecError, _args
from determined_trials.launch import torch_distributed as td
from determined_trials.launch.harness import load_pytorch_trial

TRIAL_BODY = """
    def __init__(self, context):
        self.context = context

    def build_training_data_loader(self):
        raise NotImplementedError

    def build_validation_data_loader(self):
        raise NotImplementedError

    def train_batch(self, batch, epoch_idx, batch_idx):
        return {}

    def evaluate_batch(self, batch):
        return {}
"""


@pytest.fixture(autouse=True)
def _restore_import_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Forget the trial modules a test imported from its folder (never torch & co: no re-import)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        paths = [str(getattr(spec, "origin", None)), *[str(p) for p in getattr(spec, "submodule_search_locations", None) or []]]
        if any(p.startswith(str(tmp_path)) for p in paths):
            del sys.modules[name]


def _write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def _trial_file(folder: Path, name: str, extra: str = "") -> Path:
    source = "from determined_trials import pytorch\n" + extra + "\n\nclass GoodTrial(pytorch.PyTorchTrial):\n"
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source + TRIAL_BODY)
    return path


def _error(spec: str, context: Path) -> str:
    with pytest.raises(TrialSpecError) as info:
        load_pytorch_trial(spec, context)
    return str(info.value)


# -- loading -------------------------------------------------------------------------------------


def test_file_and_module_forms_load_with_sibling_imports(tmp_path: Path) -> None:
    _write(tmp_path, "spec_helpers_a.py", "VALUE = 41\n")
    _trial_file(tmp_path, "spec_model_a.py", "import spec_helpers_a\nfrom spec_helpers_a import VALUE")
    assert load_pytorch_trial("spec_model_a.py:GoodTrial", tmp_path).__name__ == "GoodTrial"
    assert load_pytorch_trial("spec_model_a:GoodTrial", tmp_path).__name__ == "GoodTrial"


def test_a_file_in_a_subfolder_imports_its_siblings_both_ways(tmp_path: Path) -> None:
    _write(tmp_path, "spec_pkg_b/spec_util_b.py", "SCALE = 2\n")
    _trial_file(tmp_path, "spec_pkg_b/spec_model_b.py", "from . import spec_util_b\nimport spec_util_b as plain")
    cls = load_pytorch_trial("spec_pkg_b/spec_model_b.py:GoodTrial", tmp_path)
    assert cls.__module__ == "spec_pkg_b.spec_model_b"
    assert load_pytorch_trial("spec_pkg_b.spec_model_b:GoodTrial", tmp_path) is not None


def test_missing_file(tmp_path: Path) -> None:
    message = _error("nowhere.py:GoodTrial", tmp_path)
    assert "the trial file 'nowhere.py' does not exist" in message and str(tmp_path) in message
    assert "no module 'spec_nowhere_c'" in _error("spec_nowhere_c:GoodTrial", tmp_path)


def test_a_file_that_fails_to_import_shows_the_error_and_the_line(tmp_path: Path) -> None:
    _write(tmp_path, "spec_broken_d.py", "import os\nimport not_a_real_package_xyz\n")
    message = _error("spec_broken_d.py:GoodTrial", tmp_path)
    assert "importing" in message and "failed" in message
    assert "ModuleNotFoundError: No module named 'not_a_real_package_xyz'" in message
    assert "spec_broken_d.py:2" in message
    _write(tmp_path, "spec_syntax_d.py", "def broken(:\n")
    assert "SyntaxError" in _error("spec_syntax_d.py:X", tmp_path)


def test_missing_class_lists_the_trial_classes(tmp_path: Path) -> None:
    _trial_file(tmp_path, "spec_model_e.py", "class Helper:\n    pass")
    message = _error("spec_model_e.py:GoodTrail", tmp_path)
    assert "has no 'GoodTrail'" in message
    assert "the trial classes in it are: GoodTrial" in message and "Did you mean 'GoodTrial'?" in message
    _write(tmp_path, "spec_empty_e.py", "X = 1\n")
    assert "defines no trial classes" in _error("spec_empty_e.py:GoodTrial", tmp_path)


def test_not_a_trial(tmp_path: Path) -> None:
    _trial_file(tmp_path, "spec_model_f.py", "class Plain:\n    pass\n\ndef function():\n    pass")
    message = _error("spec_model_f.py:Plain", tmp_path)
    assert "'Plain'" in message and "is not a trial class" in message and "PyTorchTrial" in message
    assert "is a function, not a trial class" in _error("spec_model_f.py:function", tmp_path)


def test_a_trial_of_another_family_names_its_launcher(tmp_path: Path) -> None:
    _write(tmp_path, "spec_other_g.py", """
        class DeepSpeedTrial:  # stands in for det.deepspeed.DeepSpeedTrial (matched by name)
            pass

        class TFKerasTrial:
            pass

        class MyDeepSpeed(DeepSpeedTrial):
            pass

        class MyKeras(TFKerasTrial):
            pass
    """)
    # the harness runs DeepSpeedTrials and TFKerasTrials itself; a look-alike base class is named as the problem
    assert "not a subclass of det.deepspeed.DeepSpeedTrial" in _error("spec_other_g.py:MyDeepSpeed", tmp_path)
    assert "not a subclass of det.keras.TFKerasTrial" in _error("spec_other_g.py:MyKeras", tmp_path)


def test_an_incomplete_trial(tmp_path: Path) -> None:
    _write(tmp_path, "spec_partial_h.py", """
        from determined_trials import pytorch

        class Partial(pytorch.PyTorchTrial):
            def __init__(self, context):
                pass
    """)
    message = _error("spec_partial_h.py:Partial", tmp_path)
    assert "does not define" in message and "train_batch" in message


@pytest.mark.parametrize(("spec", "expected"), [
    ("", "empty --trial spec"),
    ("   ", "empty --trial spec"),
    ("model_def.py", "does not name a class"),
    ("model_def", "does not name a class"),
    (":MyTrial", "does not name a class"),
    ("model_def.py:", "is not a Python class name"),
    ("model_def.py:My-Trial", "is not a Python class name"),
    ("my-model:MyTrial", "is not a module name"),
])
def test_malformed_specs(spec: str, expected: str, tmp_path: Path) -> None:
    assert expected in _error(spec, tmp_path)


# -- the harness process ---------------------------------------------------------------------------


def _harness(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    return subprocess.run([sys.executable, "-m", "determined_trials.launch.harness", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env={**clean, **(env or {})})


def test_harness_errors_exit_2_with_one_message_and_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("searcher: {name: single, metric: m, max_length: 1}\n")
    _trial_file(tmp_path, "model_def.py")
    missing = _harness("--config", "c.yaml", "--trial", "model_def.py:Nope", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        "error: --trial 'model_def.py:Nope': " f"{tmp_path / 'model_def.py'} has no 'Nope'; "
        "the trial classes in it are: GoodTrial."
    ]
    no_config = _harness("--trial", "model_def.py:GoodTrial", cwd=tmp_path)
    assert no_config.returncode == 2 and "no experiment configuration: pass --config PATH" in no_config.stderr
    (tmp_path / "bad.yaml").write_text("searcher: {name: single}\n")
    bad_config = _harness("model_def:GoodTrial", "--config", "bad.yaml", cwd=tmp_path)
    assert bad_config.returncode == 2 and "Traceback" not in bad_config.stderr and "searcher" in bad_config.stderr


def test_harness_reads_the_config_from_the_environment_and_the_context_dir(tmp_path: Path) -> None:
    code = tmp_path / "code"
    _write(code, "sibling_data.py", "N = 3\n")
    _write(code, "model_def.py", """
        import sys
        import sibling_data
        from determined_trials import pytorch
        print("imported with", sibling_data.N, flush=True)
        sys.exit(0)
    """)
    (tmp_path / "c.yaml").write_text("searcher: {name: single, metric: m, max_length: 1}\n")
    out = _harness("--trial", "model_def.py:T", "--context-dir", str(code), cwd=tmp_path,
                   env={"DET_EXPERIMENT_CONFIG": str(tmp_path / "c.yaml")})
    assert "importing" in out.stderr and "SystemExit" in out.stderr  # a module that exits is an import failure
    assert "imported with 3" in out.stdout


# -- the launcher's command line -------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "overrides", "trial", "script"), [
    (["script.py", "arg"], [], None, ["script.py", "arg"]),
    (["--", "script.py", "--", "arg"], [], None, ["script.py", "--", "arg"]),
    (["script.py", "--", "arg"], [], None, ["script.py", "--", "arg"]),
    (["--o1", "--o2=x", "--", "script.py", "arg"], ["--o1", "--o2=x"], None, ["script.py", "arg"]),
    (["--trial", "model_def.py:T"], [], "model_def.py:T", []),
    (["--nproc_per_node", "4", "--", "--trial=m:T"], ["--nproc_per_node", "4"], "m:T", []),
    (["model_def:T"], [], "model_def:T", []),
])
def test_launcher_argument_splitting(
    argv: list[str], overrides: list[str], trial: str | None, script: list[str]
) -> None:
    args = _args.parse(argv)
    assert (args.overrides, args.trial, args.script) == (overrides, trial, script)


def test_launcher_own_options() -> None:
    args = _args.parse(["--config", "c.yaml", "--fail-grace=1.5", "--rdzv_endpoint=x:1", "--", "--trial", "m:T"])
    assert (args.config, args.fail_grace, args.overrides, args.trial) == ("c.yaml", 1.5, ["--rdzv_endpoint=x:1"], "m:T")
    assert _args.parse(["--", "--config", "d.yaml", "--trial", "m:T"]).config == "d.yaml"


@pytest.mark.parametrize(("argv", "expected"), [
    ([], "empty script is not allowed"),
    (["--"], "empty script is not allowed"),
    (["--trial", "m:T", "extra"], "extra arguments to --trial: extra"),
    (["--nproc_per_node", "2", "--trial", "m:T"], "looks like a torchrun option: end torchrun options with `--`"),
    (["--nnodes", "1", "--config", "c.yaml", "--", "--trial", "m:T"], "put it first"),
    (["--config"], "--config needs a value"),
    (["--", "--bogus"], "unrecognized argument '--bogus'"),
])
def test_launcher_usage_errors(argv: list[str], expected: str) -> None:
    with pytest.raises(_args.LaunchError, match=expected):
        _args.parse(argv)


def _config(slots: int) -> object:
    from determined_trials.config import load_config

    return load_config({"searcher": {"name": "single", "metric": "m", "max_length": 1},
                        "resources": {"slots_per_trial": slots}})


def test_launcher_command_single_node(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DET_NNODES", "DET_NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    cmd, env = td.build_command(_args.parse(["--nproc_per_node", "3", "--", "--trial", "m.py:T"]), _config(2))
    text = " ".join(cmd)
    assert "-m torch.distributed.run --nnodes 1 --node_rank 0 --nproc_per_node 2 --max_restarts 0" in text
    # one node: torchrun binds its own rendezvous port (no picked-then-released port two jobs could share)
    assert "--max_restarts 0 --standalone --monitor_interval 0.1" in text and "--master_port" not in text
    assert text.index("--nproc_per_node 2") < text.index("--nproc_per_node 3") < text.index("--no-python")
    assert "determined_trials.launch.wrap_rank RANK -- " in text
    assert text.endswith("-m determined_trials.launch.harness --trial m.py:T")
    assert env["DET_CHIEF_IP"] == "127.0.0.1" and env["USE_TORCH_DISTRIBUTED"] == "1"
    assert env["DET_JOB_ID"] and int(env["DET_CORE_PORT"]) > 0
    script_cmd, _ = td.build_command(_args.parse(["train.py", "--lr", "1"]), None)
    assert "--nproc_per_node 1" in " ".join(script_cmd)
    assert script_cmd[-3:] == ["train.py", "--lr", "1"] and script_cmd[-4] == sys.executable


def test_launcher_command_one_slot_trial_skips_torchrun() -> None:
    cmd, env = td.build_command(_args.parse(["--trial", "m.py:T"]), _config(1))
    assert "torch.distributed.run" not in cmd
    assert cmd[1:5] == ["-m", "determined_trials.launch.wrap_rank", "0", "--"]
    assert env == {}


def test_launcher_command_multi_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DET_NNODES", "2")
    monkeypatch.setenv("DET_NODE_RANK", "1")
    monkeypatch.delenv("DET_CHIEF_IP", raising=False)
    with pytest.raises(_args.LaunchError, match="set DET_CHIEF_IP"):
        td.build_command(_args.parse(["--trial", "m.py:T"]), _config(4))
    monkeypatch.setenv("DET_CHIEF_IP", "10.0.0.5")
    cmd, env = td.build_command(_args.parse(["--trial", "m.py:T"]), _config(4))
    text = " ".join(cmd)
    assert "--nnodes 2 --node_rank 1 --nproc_per_node 2" in text
    assert "--master_addr 10.0.0.5 --master_port 29400" in text and "DET_JOB_ID" not in env
    with pytest.raises(_args.LaunchError, match="cannot be split evenly"):
        td.build_command(_args.parse(["--trial", "m.py:T"]), _config(3))


def test_launcher_reports_spec_and_config_problems_before_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DET_EXPERIMENT_CONFIG", raising=False)
    monkeypatch.delenv("DET_CLUSTER_INFO", raising=False)
    (tmp_path / "c.yaml").write_text("searcher: {name: single, metric: m, max_length: 1}\n")
    assert td.main(["--config", "c.yaml", "--trial", "missing.py:T"]) == 2
    assert "the trial file 'missing.py' does not exist" in capsys.readouterr().err
    _trial_file(tmp_path, "model_def.py")
    assert td.main(["--trial", "model_def.py:GoodTrial"]) == 2
    assert "--trial needs an experiment config" in capsys.readouterr().err
    assert td.main(["--config", "nope.yaml", "--trial", "model_def.py:GoodTrial"]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_entrypoint_command() -> None:
    from determined_trials.launch import entrypoint_command

    assert entrypoint_command("model_def:MyTrial", python="py") == [
        "py", "-m", "determined_trials.launch.torch_distributed", "--", "--trial", "model_def:MyTrial"]
    assert entrypoint_command("python3 train.py --x 1") == ["sh", "-c", "python3 train.py --x 1"]
    assert entrypoint_command(["python3", "train.py"]) == ["python3", "train.py"]


def test_harness_config_from_cluster_info_and_latest_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from determined_trials import ClusterInfo, TrialInfo
    from determined_trials.launch import harness

    conf = {"searcher": {"name": "single", "metric": "m", "max_length": 3}, "scheduling_unit": 7}
    info = ClusterInfo(trial=TrialInfo(trial_id=1, experiment_id=1, trial_seed=3, hparams={}, config=conf),
                       run_dir=str(tmp_path / "runs"))
    monkeypatch.delenv("DET_EXPERIMENT_CONFIG", raising=False)
    monkeypatch.setenv("DET_CLUSTER_INFO", str(info.write(tmp_path / "info.json")))
    config = harness._load_experiment_config(None)
    assert config.scheduling_unit == 7
    fit = harness._fit_arguments(config, None)
    assert (fit["max_length"], fit["validation_period"], repr(fit["reporting_period"])) == (None, None, "Batch(7)")
    with pytest.raises(harness.HarnessError, match="there is no checkpoint in"):
        harness.resolve_latest_checkpoint("latest")
    assert harness.resolve_latest_checkpoint("abc") == "abc"


def test_harness_fit_arguments_from_the_config() -> None:
    from determined_trials.config import load_config
    from determined_trials.launch import harness
    from determined_trials.loop import Batch, Epoch

    config = load_config({
        "searcher": {"name": "single", "metric": "m", "max_length": {"epochs": 3}},
        "min_validation_period": {"epochs": 2}, "min_checkpoint_period": {"batches": 0},
        "perform_initial_validation": True, "checkpoint_policy": "all", "profiling": {"enabled": True},
    })
    assert harness._fit_arguments(config, "uuid-1") == {
        "max_length": None, "validation_period": Epoch(2), "checkpoint_period": None,
        "reporting_period": Batch(100), "checkpoint_policy": "all", "latest_checkpoint": "uuid-1",
        "step_zero_validation": True, "profiling_enabled": True,
    }
