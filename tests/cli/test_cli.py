"""Tests for the ``det-trials`` CLI: tables, CSV, JSON and error exit codes, in-process and as a subprocess."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import determined_trials
from determined_trials.cli.main import main
from determined_trials.core import LocalStore

_CONFIG = {
    "name": "digits",
    "hyperparameters": {"lr": 0.1},
    "searcher": {"name": "single", "metric": "loss", "smaller_is_better": True, "max_length": {"batches": 30}},
}


def _fill(run_dir: Path) -> dict[str, int]:
    store = LocalStore(run_dir)
    exp = store.create_experiment(name="digits", config=_CONFIG, labels=["cpu", "small"], description="demo")
    other = store.create_experiment(name="other-exp", config={})
    t1 = store.create_trial(experiment_id=exp, hparams={"lr": 0.1, "opt": {"name": "sgd"}}, seed=11)
    t2 = store.create_trial(experiment_id=other, hparams={"lr": 0.5}, seed=12)
    for steps in (10, 20, 30):
        store.add_metrics(trial_id=t1, group="training", steps_completed=steps,
                          metrics={"loss": 1.0 / steps, "acc": steps / 100})
    store.add_metrics(trial_id=t1, group="validation", steps_completed=30,
                      metrics={"loss": 0.25, "val_acc": float("nan"), "cm": [[1, 0], [0, 1]]})
    store.add_metrics(trial_id=t1, group="validation", steps_completed=20, metrics={"loss": 0.5})
    store.add_checkpoint(uuid="ckpt-a", trial_id=t1, steps_completed=20, metadata={"steps_completed": 20},
                         resources={"model.pt": 2048, "metadata.json": 10}, storage=str(run_dir / "checkpoints"))
    store.add_checkpoint(uuid="ckpt-b", trial_id=t2, steps_completed=5, metadata={"steps_completed": 5},
                         resources={"model.pt": 10}, storage=str(run_dir / "checkpoints"))
    store.add_checkpoint(uuid="ckpt-gone", trial_id=t1, steps_completed=10, metadata={"steps_completed": 10},
                         resources={"model.pt": 1}, storage=str(run_dir / "checkpoints"))
    store.mark_checkpoint_deleted("ckpt-gone")
    store.set_trial_state(t2, "COMPLETED")
    store.set_experiment_state(other, "COMPLETED")
    store.close()
    return {"exp": exp, "other": other, "t1": t1, "t2": t2}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "runs"
    _fill(path)
    return path


def _run(capsys: pytest.CaptureFixture[str], run_dir: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--run-dir", str(run_dir), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _strict_json(text: str) -> Any:
    def no_constants(name: str) -> Any:
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=no_constants)


def test_experiment_list(capsys: pytest.CaptureFixture[str], run_dir: Path) -> None:
    code, out, _ = _run(capsys, run_dir, "experiment", "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:4] == ["ID", "NAME", "STATE", "TRIALS"]
    assert lines[2].split()[:5] == ["1", "digits", "ACTIVE", "1", "cpu,small"]
    assert lines[3].split()[:4] == ["2", "other-exp", "COMPLETED", "1"]
    code, out, _ = _run(capsys, run_dir, "experiment", "list", "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["name"] for r in rows] == ["digits", "other-exp"] and rows[0]["labels"] == "cpu,small"
    code, out, _ = _run(capsys, run_dir, "experiment", "list", "--json")
    data = _strict_json(out)
    assert [e["name"] for e in data] == ["digits", "other-exp"] and data[0]["config"] == _CONFIG


def test_experiment_describe(capsys: pytest.CaptureFixture[str], run_dir: Path) -> None:
    code, out, _ = _run(capsys, run_dir, "experiment", "describe", "1")
    assert code == 0
    assert "Experiment 1" in out and "digits" in out and "best validation: loss = 0.25" in out
    assert "Trials (1):" in out and "opt.name=sgd" in out and "max_length:" in out
    code, out, _ = _run(capsys, run_dir, "experiment", "describe", "1", "--json")
    data = _strict_json(out)
    assert data["name"] == "digits" and [t["seed"] for t in data["trials"]] == [11]
    assert [c["uuid"] for c in data["checkpoints"]] == ["ckpt-a"]


def test_trial_list(capsys: pytest.CaptureFixture[str], run_dir: Path) -> None:
    code, out, _ = _run(capsys, run_dir, "trial", "list")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[2:]] == ["1", "2"]
    code, out, _ = _run(capsys, run_dir, "trial", "list", "--experiment", "2", "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["id"], r["state"], r["seed"], r["hparams"]) for r in rows] == [("2", "COMPLETED", "12", "lr=0.5")]
    code, out, _ = _run(capsys, run_dir, "trial", "list", "--json")
    assert [t["hparams"] for t in _strict_json(out)] == [{"lr": 0.1, "opt": {"name": "sgd"}}, {"lr": 0.5}]


def test_trial_metrics_table(capsys: pytest.CaptureFixture[str], run_dir: Path) -> None:
    code, out, _ = _run(capsys, run_dir, "trial", "metrics", "1")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["STEPS", "GROUP", "loss", "acc", "val_acc", "cm"]
    body = [line.split() for line in lines[2:]]
    assert [row[:2] for row in body] == [
        ["10", "training"], ["20", "training"], ["20", "validation"], ["30", "training"], ["30", "validation"]
    ]
    assert body[4] == ["30", "validation", "0.25", "nan", "[[1,0],[0,1]]"]
    code, out, _ = _run(capsys, run_dir, "trial", "metrics", "1", "--group", "validation")
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["20", "30"]


def test_trial_metrics_csv_and_json(capsys: pytest.CaptureFixture[str], run_dir: Path) -> None:
    code, out, _ = _run(capsys, run_dir, "trial", "metrics", "1", "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and list(rows[0]) == ["steps_completed", "group", "loss", "acc", "val_acc", "cm"]
    assert [float(r["loss"]) for r in rows if r["group"] == "training"] == [0.1, 0.05, 1 / 30]
    assert rows[4]["val_acc"] == "nan" and json.loads(rows[4]["cm"]) == [[1, 0], [0, 1]]
    assert rows[0]["val_acc"] == ""
    code, out, _ = _run(capsys, run_dir, "trial", "metrics", "1", "--group", "validation", "--json")
    data = _strict_json(out)
    assert [(r["steps_completed"], r["group"]) for r in data] == [(20, "validation"), (30, "validation")]
    assert data[1]["metrics"] == {"loss": 0.25, "val_acc": "NaN", "cm": [[1, 0], [0, 1]]}


def test_checkpoint_list(capsys: pytest.CaptureFixture[str], run_dir: Path) -> None:
    code, out, _ = _run(capsys, run_dir, "checkpoint", "list")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[2:]] == ["ckpt-a", "ckpt-b"]
    assert "2.0 KiB" in out
    code, out, _ = _run(capsys, run_dir, "checkpoint", "list", "--trial", "1", "--include-deleted", "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["uuid"], r["state"], r["size"], r["files"]) for r in rows] == [
        ("ckpt-a", "COMPLETED", "2058", "2"), ("ckpt-gone", "DELETED", "1", "1")
    ]
    code, out, _ = _run(capsys, run_dir, "checkpoint", "list", "--experiment", "2", "--json")
    assert [(c["uuid"], c["resources"]) for c in _strict_json(out)] == [("ckpt-b", {"model.pt": 10})]


def test_tables_fit_the_terminal_and_wide_prints_everything(
    capsys: pytest.CaptureFixture[str], run_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = LocalStore(run_dir)
    long = {f"hparam_{i}": 0.001 * i for i in range(12)}  # a wide grid's trial: ~190 characters of hparams
    store.create_trial(experiment_id=1, hparams=long, seed=13)
    store.close()
    monkeypatch.chdir(run_dir.parent)
    monkeypatch.setenv("COLUMNS", "140")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # a terminal 140 characters wide
    code, out, _ = _run(capsys, run_dir, "trial", "list")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 140, out
    row = out.splitlines()[-1]
    assert "hparam_0=0 hparam_1=0.001" in row and "…" in row and "hparam_11" not in row
    assert row.split()[-2:][0].count("-") == 2  # STARTED still whole (a date)
    code, out, _ = _run(capsys, run_dir, "trial", "list", "--wide")
    assert "hparam_11=0.011" in out and "…" not in out
    code, out, _ = _run(capsys, run_dir, "checkpoint", "list")
    assert f"{run_dir}" not in out and "  runs/checkpoints" in out  # from where we are, once per row
    code, out, _ = _run(capsys, run_dir, "checkpoint", "list", "--wide")
    assert str(run_dir / "checkpoints") in out
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)  # a pipe: every cell whole
    code, out, _ = _run(capsys, run_dir, "trial", "list")
    assert "hparam_11=0.011" in out


def test_empty_store_prints_headers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    LocalStore(tmp_path)
    code, out, _ = _run(capsys, tmp_path, "trial", "list")
    assert code == 0 and out.splitlines()[0].startswith("ID")
    code, out, _ = _run(capsys, tmp_path, "checkpoint", "list", "--json")
    assert code == 0 and json.loads(out) == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["experiment", "describe", "7"], "experiment 7 not found"),
        (["trial", "list", "--experiment", "7"], "experiment 7 not found"),
        (["trial", "metrics", "99"], "trial 99 not found"),
        (["checkpoint", "list", "--trial", "99"], "trial 99 not found"),
    ],
)
def test_unknown_ids_exit_2(capsys: pytest.CaptureFixture[str], run_dir: Path, argv: list[str], message: str) -> None:
    code, out, err = _run(capsys, run_dir, *argv)
    assert code == 2 and out == "" and message in err and str(run_dir) in err


def test_missing_run_dir_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, tmp_path / "nowhere", "experiment", "list")
    assert code == 2 and "does not exist" in err and "--run-dir" in err
    assert not (tmp_path / "nowhere").exists()
    code, _, err = _run(capsys, tmp_path, "experiment", "list")
    assert code == 2 and "has no store" in err


def test_usage_errors_and_help(capsys: pytest.CaptureFixture[str], run_dir: Path) -> None:
    assert main([]) == 2
    assert main(["experiment"]) == 2
    assert main(["trial", "metrics", "not-a-number"]) == 2
    assert main(["trial", "metrics", "1", "--csv", "--json"]) == 2
    assert main(["checkpoint", "list", "--trial", "1", "--experiment", "1"]) == 2
    capsys.readouterr()
    assert main(["--help"]) == 0
    assert "experiment" in capsys.readouterr().out


def test_run_dir_from_env_and_after_subcommand(
    capsys: pytest.CaptureFixture[str], run_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DET_RUN_DIR", str(run_dir))
    assert main(["experiment", "list", "--csv"]) == 0
    assert "digits" in capsys.readouterr().out
    monkeypatch.setenv("DET_RUN_DIR", str(tmp_path / "elsewhere"))
    assert main(["trial", "list", "--run-dir", str(run_dir)]) == 0
    assert "lr=0.5" in capsys.readouterr().out
    monkeypatch.delenv("DET_RUN_DIR")
    monkeypatch.chdir(tmp_path)
    _fill(tmp_path / "det-runs")
    assert main(["trial", "list", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2


def _env() -> dict[str, str]:
    """The environment with this checkout first on the path (an editable install may predate it)."""
    root = str(Path(determined_trials.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def _script() -> Path:
    script = Path(sys.executable).with_name("det-trials")
    if not script.exists():
        pytest.skip(f"{script} is not installed (pip install -e . creates it)")
    return script


def test_console_script_subprocess(run_dir: Path) -> None:
    script = _script()
    done = subprocess.run([str(script), "--run-dir", str(run_dir), "trial", "metrics", "1", "--csv"],
                          check=False, capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 0, done.stderr
    assert len(list(csv.DictReader(io.StringIO(done.stdout)))) == 5
    done = subprocess.run([str(script), "--run-dir", str(run_dir), "trial", "metrics", "42"],
                          check=False, capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 2 and "trial 42 not found" in done.stderr and "Traceback" not in done.stderr


def test_cli_imports_no_framework() -> None:
    code = (
        "import sys, determined_trials.cli.main; "
        "print(','.join(m for m in ('torch', 'tensorflow', 'deepspeed') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          env=_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
