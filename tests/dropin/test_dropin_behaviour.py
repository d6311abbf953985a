"""Issue 8, items 6-10: callbacks Determined code defines (the old epoch-start form, validation-epoch
hooks, on_checkpoint_end), one-element metrics as numbers, user `batches`/`epochs` metrics kept,
progress reported by Trainer.fit, and per-batch metrics for callbacks only on request."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from support.helpers_paths import REPO
from torch import nn
from trials_pytorch import LINEAR_XS, LinearTrial, config, fit

from determined_trials import pytorch
from determined_trials.pytorch import Batch

pytestmark = pytest.mark.usefixtures("cpu_device")  # trains on the CPU: exact values, CPU tensors and bf16 AMP (docs/gpu.md)


class _OldStyle(pytorch.PyTorchCallback):
    def __init__(self, events: list[tuple[Any, ...]]) -> None:
        self.events = events

    def on_training_epoch_start(self) -> None:  # type: ignore[override]  # the pre-0.2x form
        self.events.append(("old_epoch_start",))


class _Everything(pytorch.PyTorchCallback):
    def __init__(self, events: list[tuple[Any, ...]]) -> None:
        self.events = events

    def on_validation_start(self) -> None:
        self.events.append(("validation_start",))

    def on_validation_epoch_start(self) -> None:
        self.events.append(("validation_epoch_start",))

    def on_validation_epoch_end(self, outputs: list[Any]) -> None:
        self.events.append(("validation_epoch_end", [sorted(o) for o in outputs]))

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.events.append(("validation_end",))

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        self.events.append(("save_start",))

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        self.events.append(("checkpoint_end", Path(checkpoint_dir).joinpath("state_dict.pth").exists()))

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        self.events.append(("write_end",))


class _CallbackTrial(LinearTrial):
    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"old": _OldStyle(self.events), "all": _Everything(self.events)}


def test_old_epoch_start_form_validation_epoch_hooks_and_checkpoint_end(tmp_path: Path) -> None:
    with pytest.warns(FutureWarning) as caught:
        trial, _, _ = fit(_CallbackTrial, config({"global_batch_size": 4}), tmp_path, max_length=Batch(2),
                          validation_period=Batch(2))
    messages = [str(w.message) for w in caught]
    assert any("on_training_epoch_start(self) without the epoch_idx argument" in m for m in messages)
    assert any("on_checkpoint_end is deprecated" in m for m in messages)
    names = [e[0] for e in trial.events if e[0] != "batch"]
    assert names.count("old_epoch_start") == 1  # 8 records / 4 = 2 batches = one epoch
    start = names.index("validation_start")
    assert names[start:start + 7] == ["validation_start", "validation_epoch_start", "validation_epoch_end",
                                      "validation_end", "save_start", "checkpoint_end", "write_end"]
    epoch_end = next(e for e in trial.events if e[0] == "validation_epoch_end")
    assert epoch_end[1] == [["validation_loss"], ["validation_loss"]]  # this rank's 2 validation batches
    assert ("checkpoint_end", True) in trial.events


# -- item 7: metrics ---------------------------------------------------------------------------------------


class _OneElementTrial(LinearTrial):
    """[1]-shaped tensors everywhere, a [1]-shaped reducer result, user metrics named batches/epochs."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.seen = context.wrap_reducer(lambda values: torch.stack(values).sum().reshape(1), name="xsum",
                                         for_validation=False)

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"recorder": _Keep(self.events)}

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        loss = super().train_batch(batch, epoch_idx, batch_idx)
        self.seen.update(batch[1].sum())
        return {"loss": loss.reshape(1), "batches": torch.tensor([42.0]), "epochs": 7}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        _, x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y).reshape(1)}


class _Keep(pytorch.PyTorchCallback):
    def __init__(self, events: list[tuple[Any, ...]]) -> None:
        self.events = events

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        self.events.append(("workload_end", dict(avg_metrics)))

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.events.append(("validation_end", dict(metrics)))


def test_one_element_values_are_numbers_and_user_batches_epochs_are_kept(tmp_path: Path) -> None:
    trial, _, info = fit(_OneElementTrial, config({"global_batch_size": 4}), tmp_path, max_length=Batch(2),
                         validation_period=Batch(2), reporting_period=Batch(2), checkpoint_policy="best")
    workload = next(e[1] for e in trial.events if e[0] == "workload_end")
    validation = next(e[1] for e in trial.events if e[0] == "validation_end")
    assert isinstance(workload["loss"], float) and isinstance(workload["xsum"], float)
    assert workload["xsum"] == pytest.approx(sum(LINEAR_XS))  # every record's x, summed once
    assert isinstance(validation["validation_loss"], float)  # the searcher metric is usable for "best"
    assert [c.steps_completed for c in info["checkpoints"]] == [2]
    reported = info["training"][0].metrics
    assert (reported["batches"], reported["epochs"]) == (42.0, 7)  # the user's, not the harness's
    assert isinstance(reported["loss"], float) and isinstance(info["validation"][0].metrics["validation_loss"], float)


# -- item 8: progress ------------------------------------------------------------------------------------


def test_fit_reports_progress_at_each_boundary(tmp_path: Path) -> None:
    seen: list[float] = []

    def build(context: pytorch.PyTorchTrialContext) -> Any:
        core = context._core
        assert core is not None
        original = core.train.report_progress

        def record(progress: float) -> None:
            seen.append(progress)
            original(progress)

        core.train.report_progress = record  # type: ignore[method-assign]
        return LinearTrial(context)

    with pytorch.init(exp_conf=config({"global_batch_size": 2}), run_dir=tmp_path) as context:
        trial = build(context)
        pytorch.Trainer(trial, context).fit(max_length=Batch(4), reporting_period=Batch(1), show_progress=False)
        core = context._core
        assert core is not None
        stored = core.store.trial(context.get_trial_id()).progress
    assert seen == [0.25, 0.5, 0.75, 1.0]
    assert stored == 1.0


# -- item 10: per-batch metrics on request ------------------------------------------------------------------


class _Batches(pytorch.PyTorchCallback):
    def __init__(self, wants: bool, got: list[Any]) -> None:
        self.wants_batch_metrics = wants
        self.got = got

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        self.got.append(batch_metrics)


@pytest.mark.parametrize("wants", [False, True])
def test_batch_metrics_only_for_a_callback_that_asks(tmp_path: Path, wants: bool) -> None:
    got: list[Any] = []

    class _Trial(LinearTrial):
        def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
            return {"batches": _Batches(wants, got)}

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        trial, _, _ = fit(_Trial, config({"global_batch_size": 2}), tmp_path, max_length=Batch(3),
                          reporting_period=Batch(2))
    if not wants:
        assert got == [[], []]
        return
    losses = [entry["loss"] for entry in trial.log]
    assert [[b["loss"] for b in workload] for workload in got] == [pytest.approx(losses[:2]),
                                                                    pytest.approx(losses[2:])]


def test_batch_metrics_average_over_the_ranks_that_trained_each_batch() -> None:
    from determined_trials.pytorch._adapter import _average_batches

    per_rank = [[{"loss": 1.0, "tag": "a"}, {"loss": 3.0, "tag": "a"}], [{"loss": 2.0, "tag": "b"}]]
    assert _average_batches(per_rank) == [{"loss": 1.5, "tag": "a"}, {"loss": 3.0, "tag": "a"}]
    assert _average_batches([[], []]) == []


# -- item 12: the page's commands exist ----------------------------------------------------------------------


def test_every_det_trials_command_on_the_page_exists(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/coming-from-determined.md names only det-trials commands that exist."""
    import re

    from determined_trials.cli.main import main

    page = (REPO / "docs" / "coming-from-determined.md").read_text()
    commands = set(re.findall(r"`det-trials ([a-z]+)(?: ([a-z]+))?", page))
    assert {("experiment", "create"), ("experiment", "continue"), ("trial", "logs"), ("checkpoint", "export"),
            ("tensorboard", "")} <= commands
    for group, sub in sorted(commands):
        try:
            status = main([group, *([sub] if sub else []), "--help"])
        except SystemExit as done:
            status = done.code
        assert status == 0, (group, sub)
        assert f"usage: det-trials {group} {sub}".strip() in capsys.readouterr().out



def test_a_det_command_maps_to_the_det_trials_command_of_the_same_name_where_there_is_one() -> None:
    """A row `det GROUP SUB` names `det-trials GROUP SUB` when that command exists (not a near one)."""
    import re

    from determined_trials.cli.main import build_parser

    parser = build_parser()
    groups = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    page = (REPO / "docs" / "coming-from-determined.md").read_text()
    for row in page.splitlines():
        cells = row.split("|")
        if len(cells) < 4 or "--" in cells[1]:  # a variant (`create --test`) maps to something else
            continue
        for group, sub in re.findall(r"`det ([a-z]+) ([a-z]+)", re.sub(r"\(.*?\)", "", cells[1])):  # not asides
            subs = next((a.choices for a in groups[group]._actions if isinstance(a, argparse._SubParsersAction)),
                        {}) if group in groups else {}
            if sub in subs:
                assert f"`det-trials {group} {sub}" in cells[2], row
