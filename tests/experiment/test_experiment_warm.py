"""Warm trial processes (``experiment/_warm``, ``_zygote``): trials forked from a warm parent train bitwise like
cold ones, a crashing, leaking or SIGKILLed trial leaves the next one untouched, an edited model folder is
imported again, a model_def that starts a thread falls back to cold starts with one warning, and
``resources: {warm_processes: false}`` starts every trial cold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from support.helpers_experiment import create
from support.helpers_paths import SUPPORT

from determined_trials.config import load_config
from determined_trials.core import LocalStore
from determined_trials.experiment._warm import warm_spec

_SLOW = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.usefixtures("cpu_device")]


def _slow(test: Any) -> Any:
    for mark in _SLOW:
        test = mark(test)
    return test


def test_only_a_one_slot_model_def_entrypoint_starts_warm() -> None:
    assert warm_spec(" model_def:MyTrial ", 1) == "model_def:MyTrial"
    assert warm_spec("model_def:MyTrial", 2) is None  # torchrun starts the ranks
    assert warm_spec("python3 train.py", 1) is None
    assert warm_spec(["python3", "-m", "determined_trials.launch.torch_distributed", "--trial", "m:T"], 1) is None


def test_warm_processes_is_on_by_default_and_can_be_switched_off() -> None:
    searcher = {"name": "single", "metric": "loss", "max_length": 1}
    assert load_config({"searcher": searcher}).resources.warm_processes is True
    off = load_config({"searcher": searcher, "resources": {"warm_processes": False}})
    assert off.resources.warm_processes is False


def _experiment(tmp_path: Path, modes: list[str], *, lr: list[float] | None = None, warm: bool | None = None,
                prelude: str = "") -> tuple[Path, Path, Path]:
    """(config, context folder, run folder) of a grid over ``mode`` (and ``lr``), one trial at a time."""
    ctx = tmp_path / "ctx"
    ctx.mkdir(parents=True)
    (ctx / "model_def.py").write_text(prelude + (SUPPORT / "trials_warm_processes.py").read_text())
    (ctx / "helper.py").write_text("VALUE = 1\n")
    config: dict[str, Any] = {
        "name": "warm", "entrypoint": "model_def:WarmTrial", "max_restarts": 1,
        "hyperparameters": {"global_batch_size": 8, "mode": {"type": "categorical", "vals": modes},
                            "lr": {"type": "categorical", "vals": lr or [0.1]}},
        "searcher": {"name": "grid", "metric": "validation_loss", "max_length": {"batches": 6}},
        "min_validation_period": {"batches": 3}, "min_checkpoint_period": {"batches": 3},
        "reproducibility": {"experiment_seed": 5},
    }
    if warm is not None:
        config["resources"] = {"warm_processes": warm}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, ctx, tmp_path / "run"


def _run(tmp_path: Path, modes: list[str], **kwargs: Any) -> tuple[LocalStore, dict[int, list[dict[str, Any]]]]:
    config, ctx, run_dir = _experiment(tmp_path, modes, **kwargs)
    create(run_dir, config, ctx, "--max-parallel", "1")
    store = LocalStore(run_dir)
    marks: dict[int, list[dict[str, Any]]] = {}  # per trial, what each of its processes saw
    for path in sorted(run_dir.glob("mark_*.json"), key=lambda p: p.stat().st_mtime):
        marks.setdefault(int(path.stem.split("_")[1]), []).append(json.loads(path.read_text()))
    return store, marks


def _weights(store: LocalStore, trial_id: int) -> dict[str, torch.Tensor]:
    latest = store.latest_checkpoint(trial_id)
    assert latest is not None
    saved = torch.load(store.path / "checkpoints" / latest.uuid / "state_dict.pth", weights_only=False)
    return saved["models_state_dict"][0]


def _metrics(store: LocalStore, trial_id: int) -> list[tuple[Any, ...]]:
    return [(m.group, m.steps_completed, m.metrics, m.batch_metrics) for m in store.metrics(trial_id)]


@_slow
def test_warm_trials_train_bitwise_like_cold_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # scipy.linalg and scikit-learn start native pools at import (OpenBLAS, jemalloc): fork-safe, still warm
    prelude = "import scipy.linalg, sklearn  # noqa: F401, E401\n"
    shadow = tmp_path / "cwd"  # the warm parent imports nothing from the runner's folder (a trial would not)
    shadow.mkdir()
    (shadow / "sklearn.py").write_text("raise RuntimeError('not the real sklearn')\n")
    monkeypatch.chdir(shadow)
    warm, warm_marks = _run(tmp_path / "warm", ["ok"], lr=[0.1, 0.3], prelude=prelude)
    cold, cold_marks = _run(tmp_path / "cold", ["ok"], lr=[0.1, 0.3], warm=False, prelude=prelude)
    assert [[m["warm"] for m in ms] for _, ms in sorted(warm_marks.items())] == [[True], [True]]
    assert [[m["warm"] for m in ms] for _, ms in sorted(cold_marks.items())] == [[False], [False]]  # switched off
    for trial in warm.trials():
        a, b = _weights(warm, trial.id), _weights(cold, trial.id)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert _metrics(warm, trial.id) == _metrics(cold, trial.id)
        assert _metrics(warm, trial.id)


@_slow
def test_a_crashing_leaking_or_killed_trial_leaves_the_next_one_untouched(tmp_path: Path) -> None:
    store, marks = _run(tmp_path, ["crash", "leak", "kill", "ok"])
    trials = {t.hparams["mode"]: t for t in store.trials()}
    assert {mode: (t.state, t.restarts) for mode, t in trials.items()} == {
        "crash": ("COMPLETED", 1), "leak": ("COMPLETED", 0), "kill": ("COMPLETED", 1), "ok": ("COMPLETED", 0)}
    assert [len(marks[trials[mode].id]) for mode in ("crash", "leak", "kill", "ok")] == [2, 1, 2, 1]
    for trial_id, seen in marks.items():  # every process, each one after a failure too, starts warm and clean
        assert seen == [{"warm": True, "leak": 0, "package_leak": 0, "helper": 1}] * len(seen), trial_id
    model = Path(store.experiment(1).model_dir or "")
    # imported by the preflight and the warm parent only: the six trial processes reuse the parent's import
    assert len((model / "imported.log").read_text().split()) == 2
    trial_pids = {int(path.stem.split("_")[2]) for path in store.path.glob("mark_*.json")}
    finalized = model / "finalized.log"  # the preflight's exit runs the hook; a trial's exit does not run its parent's
    assert not {int(pid) for pid in (finalized.read_text().split() if finalized.exists() else [])} & trial_pids


@_slow
def test_an_edited_model_folder_is_imported_again(tmp_path: Path) -> None:
    store, marks = _run(tmp_path, ["edit", "ok"])
    by_mode = {t.hparams["mode"]: marks[t.id] for t in store.trials()}
    assert by_mode["edit"][0]["helper"] == 1
    assert by_mode["ok"] == [{"warm": True, "leak": 0, "package_leak": 0, "helper": 2}]  # not the stale import


@_slow
def test_a_model_def_that_starts_a_thread_starts_cold_with_one_warning(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    prelude = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    store, marks = _run(tmp_path, ["ok", "leak"], prelude=prelude)
    err = capfd.readouterr().err
    assert err.count("warm trial processes: importing model_def:WarmTrial starts a thread") == 1, err
    assert [[m["warm"] for m in ms] for _, ms in sorted(marks.items())] == [[False], [False]]
    assert {t.state for t in store.trials()} == {"COMPLETED"}


def test_closing_a_warm_parent_ends_it_on_its_own(tmp_path: Path) -> None:
    """The runner's close is the parent's end of input: it exits by itself (exit code 0), not killed at the close's
    10 s deadline (a close that left the runner's listener blocked in recv once held every experiment's end 10 s)."""
    from determined_trials.experiment._warm import _WarmParent

    (tmp_path / "model_def.py").write_text("from determined_trials import pytorch\n\n\n"
                                           "class Trial(pytorch.PyTorchTrial):\n    pass\n")
    parent = _WarmParent()
    parent.begin("model_def:Trial", tmp_path, tmp_path / "warm_parent.log", str(tmp_path / "none.yaml"))
    assert parent.cold_reason is None, parent.cold_reason
    parent.close()
    assert parent._proc.returncode == 0, (tmp_path / "warm_parent.log").read_text()


def test_a_forked_trial_s_end_reaches_the_runner_and_wakes_it(tmp_path: Path) -> None:
    """The trial process's output ends, its exit status reaches the runner and the runner is woken then
    (``on_exit``), not at its next poll: here the harness's usage error, status 2."""
    import threading

    from determined_trials.experiment._warm import _WarmParent

    (tmp_path / "model_def.py").write_text("from determined_trials import pytorch\n\n\n"
                                           "class Trial(pytorch.PyTorchTrial):\n    pass\n")
    parent = _WarmParent()
    parent.begin("model_def:Trial", tmp_path, tmp_path / "warm_parent.log", str(tmp_path / "none.yaml"))
    assert parent.cold_reason is None, parent.cold_reason
    try:
        woken = threading.Event()
        child = parent.fork(["--trial", "model_def:Trial"], {"PATH": "/usr/bin:/bin"}, tmp_path, woken.set)
        assert child is not None
        output = child.stdout.read().decode()  # to its end: the trial closed it
        assert woken.wait(120), "the runner was not woken by the trial's end"
        assert child.wait(timeout=120) == 2, output
        assert output.startswith("error: no experiment configuration"), output
    finally:
        parent.close()


def test_the_warm_parent_started_ahead_ends_when_the_preflight_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``experiment create`` starts importing torch for the warm parent beside its preflight; a refused entrypoint
    leaves no such process behind."""
    from determined_trials.experiment import _warm

    started: list[Any] = []

    class Recorded(_warm._WarmParent):
        def __init__(self) -> None:
            super().__init__()
            started.append(self)

    monkeypatch.setattr(_warm, "_WarmParent", Recorded)
    config, ctx, run_dir = _experiment(tmp_path, ["ok"])
    config.write_text(config.read_text().replace("model_def:WarmTrial", "model_def:NoSuchTrial"))
    assert create(run_dir, config, ctx) != 0
    assert len(started) == 1 and _warm._ahead == []
    assert started[0]._proc.poll() is not None  # ended (killed: it was still importing or waiting)


def test_the_preflight_runs_in_a_fork_of_the_warm_parent_and_ends_with_it_past_its_timeout(tmp_path: Path) -> None:
    """The warm parent started ahead checks the entrypoint in a child of its own (one torch import for both); an
    import that hangs is given up at the timeout, and the parent and that child end."""
    import subprocess

    import psutil
    from support.helpers_trackers import wait_for

    from determined_trials.experiment._warm import _WarmParent

    (tmp_path / "good.py").write_text("from determined_trials import pytorch\n\n\n"
                                      "class Trial(pytorch.PyTorchTrial):\n    def train_batch(self): ...\n")
    (tmp_path / "hangs.py").write_text("import os, pathlib, time\npathlib.Path('hangs.pid').write_text(str(os.getpid()))"
                                       "\ntime.sleep(3600)\n")
    parent = _WarmParent()
    try:
        code, out, err = parent.preflight(["good:Trial", str(tmp_path)], tmp_path, 300) or (None, "", "")
        assert (code, out.strip()) == (2, ""), (code, out, err)  # the check itself ran: a PyTorchTrial lacking hooks
        assert err.startswith("error: 'good:Trial'") and "does not define" in err, err
        with pytest.raises(subprocess.TimeoutExpired):
            parent.preflight(["hangs:Trial", str(tmp_path)], tmp_path, 5)
        assert parent._proc.poll() is not None
        pid = int((tmp_path / "hangs.pid").read_text())
        wait_for("the hanging preflight child ends with its parent", lambda: not psutil.pid_exists(pid), 60)
    finally:
        parent.close()
