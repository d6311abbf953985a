"""setup.cfg's packaging: every folder of the package that Python can import (the dashboard's static assets
included) is in the packages setuptools finds, so an install raises no BuildBackendWarning about a package
left out, and ``make example``'s ``[example]`` extra holds what the digits example imports."""

from __future__ import annotations

import configparser

from setuptools import find_namespace_packages
from support.helpers_paths import REPO


def _setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    return parser


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip()]


def test_every_importable_folder_is_a_package() -> None:
    cfg = _setup_cfg()
    assert cfg["options"]["packages"] == "find_namespace:"
    found = set(find_namespace_packages(where=str(REPO), include=_lines(cfg["options.packages.find"]["include"]),
                                        exclude=_lines(cfg["options.packages.find"]["exclude"])))
    folders = {".".join(p.relative_to(REPO).parts) for p in (REPO / "determined_trials").rglob("*")
               if p.is_dir() and p.name != "__pycache__" and any(p.iterdir())}
    assert "determined_trials.ui.static" in found and folders <= found | {"determined_trials"}, folders - found
    assert not [name for name in found if "__pycache__" in name]


def test_the_example_extra_is_what_the_digits_example_imports() -> None:
    extras = _setup_cfg()["options.extras_require"]
    assert sorted(_lines(extras["example"])) == ["scikit-learn>=1.3", "torch>=2.1"]
    imports = (REPO / "examples/digits_pytorch/model_def.py").read_text()
    assert "import torch" in imports and "from sklearn" in imports and "tensorflow" not in imports
