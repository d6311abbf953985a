"""The README's two commands as the Makefile plans them (``make -n``, nothing run): a fresh ``make example``
installs only the ``[example]`` extra with pip's progress shown, ``make test`` everything, chromium comes
without recommended packages, and a venv that ``make test`` built serves ``make example`` as it is."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from support.helpers_paths import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _plan(target: str, venv: Path) -> str:
    done = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _installs(plan: str) -> list[str]:
    return [line for line in plan.splitlines() if "pip install" in line and "--upgrade pip" not in line]


def test_a_fresh_make_example_installs_the_example_extra_only(tmp_path: Path) -> None:
    installs = _installs(_plan("example", tmp_path / "venv"))
    assert installs == [f"{tmp_path / 'venv'}/bin/pip install -c constraints.txt -e '.[example]'"], installs
    assert not [line for line in installs if "--quiet" in line or " -q " in line]  # pip shows its progress


def test_make_test_installs_everything_and_chromium_without_recommends(tmp_path: Path) -> None:
    plan = _plan("test", tmp_path / "venv")
    (full,) = _installs(plan)
    assert "--quiet" not in full and "tensorflow-cpu" in full
    for extra in ("pytorch", "deepspeed", "ray", "dev", "mlflow", "wandb", "gcs", "azure", "optuna", "streaming"):
        assert extra in full.split("'.[")[1].split("]")[0].split(","), extra
    assert "apt-get install -y -qq --no-install-recommends chromium" in plan


def test_a_full_venv_serves_make_example(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()  # what `make venv` leaves, newer than setup.cfg
    assert _installs(_plan("example", venv)) == []
