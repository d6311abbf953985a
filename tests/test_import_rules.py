"""The layer rules of DESIGN.md: core/ and loop/ never import torch or tensorflow."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FRAMEWORKS = ("torch", "tensorflow", "keras", "deepspeed")


def _modules_after(code: str) -> set[str]:
    script = textwrap.dedent(code) + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    import json

    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", ["determined_trials", "determined_trials.core", "determined_trials.loop",
                                    "determined_trials.config", "determined_trials.cli.main",
                                    "determined_trials.searcher"])
def test_import_pulls_in_no_framework(module: str) -> None:
    loaded = _modules_after(f"import {module}")
    assert not {m.split(".")[0] for m in loaded} & set(FRAMEWORKS)


def test_using_the_core_api_pulls_in_no_framework(tmp_path: object) -> None:
    loaded = _modules_after(f"""
        import determined_trials as det
        with det.core.init(run_dir={str(tmp_path)!r}) as ctx:
            ctx.train.report_training_metrics(1, {{"loss": 1.0}})
            ctx.train.report_validation_metrics(1, {{"validation_loss": 1.0}})
            with ctx.checkpoint.store_path({{"steps_completed": 1}}) as (path, uuid):
                (path / "x").write_text("x")
            ctx.preempt.should_preempt()
    """)
    assert not {m.split(".")[0] for m in loaded} & set(FRAMEWORKS)


def test_pytorch_pulls_in_no_tensorflow() -> None:
    loaded = {m.split(".")[0] for m in _modules_after("import determined_trials.pytorch, determined_trials.launch")}
    assert not loaded & {"tensorflow", "keras"}


def test_keras_with_another_backend_names_keras_backend() -> None:
    import os

    env = {**os.environ, "KERAS_BACKEND": "jax"}
    out = subprocess.run([sys.executable, "-c", "import determined_trials.keras"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode != 0
    assert "KERAS_BACKEND='jax'" in out.stderr and "ImportError" in out.stderr

@pytest.mark.parametrize("module", ["determined_trials", "determined_trials.experiment", "determined_trials.cli.main",
                                    "determined_trials.core"])
def test_ray_is_imported_only_for_ray_experiments(module: str) -> None:
    assert "ray" not in {m.split(".")[0] for m in _modules_after(f"import {module}")}


@pytest.mark.slow
def test_a_local_experiment_never_imports_ray(tmp_path: Path) -> None:
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "train.py").write_text(textwrap.dedent("""
        import determined_trials as det
        with det.core.init() as ctx:
            for op in ctx.searcher.operations():
                op.report_completed(0.5)
    """))
    config = {"entrypoint": "python3 train.py", "searcher": {"name": "single", "metric": "loss", "max_length": 1}}
    loaded = _modules_after(f"""
        from determined_trials.experiment import create_experiment
        result = create_experiment({config!r}, {str(tmp_path / 'ctx')!r}, run_dir={str(tmp_path / 'runs')!r})
        assert result.state == "COMPLETED", result
    """)
    assert "determined_trials.experiment._runner" in loaded
    assert "ray" not in {m.split(".")[0] for m in loaded}

@pytest.mark.parametrize("module", ["determined_trials.pytorch", "determined_trials.deepspeed",
                                    "determined_trials.pytorch.deepspeed"])
def test_the_torch_packages_import_no_deepspeed(module: str) -> None:
    """deepspeed is imported when an engine is wrapped or det.deepspeed.init() runs, not before."""
    loaded = _modules_after(f"import {module}")
    assert "deepspeed" not in {m.split(".")[0] for m in loaded}
