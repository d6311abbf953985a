"""The layer rules of DESIGN.md: core/ and loop/ never import torch or tensorflow."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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


@pytest.mark.parametrize("module", ["determined_trials.pytorch", "determined_trials.deepspeed",
                                    "determined_trials.pytorch.deepspeed"])
def test_the_torch_packages_import_no_deepspeed(module: str) -> None:
    """deepspeed is imported when an engine is wrapped or det.deepspeed.init() runs, not before."""
    loaded = _modules_after(f"import {module}")
    assert "deepspeed" not in {m.split(".")[0] for m in loaded}
