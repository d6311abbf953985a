"""The experiment page's search section in a real browser (Debian's chromium through Playwright, headless):
for a finished PBT experiment, the best-so-far chart of the searcher metric by trial number and one lineage
table per round whose rows name each trial's parent and the checkpoint it started from."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the ui extra (starlette, uvicorn) is not installed")
pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from support.helpers_browser import Watched  # noqa: E402
from support.helpers_ui import login_url, running_ui  # noqa: E402

from determined_trials.core import LocalStore  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LENGTH = 4  # batches per round
# trial id -> (round it started in, parent trial id, its validation loss at each round end it trained through)
TRIALS: dict[int, tuple[int, int | None, list[float]]] = {
    1: (1, None, [0.5, 0.45]), 2: (1, None, [0.3, 0.28, 0.26]), 3: (1, None, [0.7]), 4: (1, None, []),
    5: (2, 2, [0.2, 0.21]), 6: (3, 5, [0.25]),
}
CHECKPOINT = "ckpt-{trial}-at-{steps}-0123456789abcdef"  # long: the page clips it, the full uuid is its title


def _pbt_run(run_dir: Path) -> LocalStore:
    """A finished PBT experiment written as the runner leaves it: population 4, 3 rounds, one child per round
    (trial 5 of trial 2 after round 1, trial 6 of trial 5 after round 2); trial 4 exited without a metric."""
    store = LocalStore(run_dir)
    config = {"name": "pbt", "searcher": {"name": "pbt", "metric": "validation_loss", "smaller_is_better": True,
                                          "population_size": 4, "num_rounds": 3, "length_per_round": LENGTH}}
    exp = store.create_experiment(name="pbt", config=config)
    for tid, (born, parent, losses) in TRIALS.items():
        start = ((born - 1) * LENGTH, CHECKPOINT.format(trial=parent, steps=(born - 1) * LENGTH))
        assert store.create_trial(experiment_id=exp, hparams={"lr": 0.01 * tid, "opt": {"name": "sgd"}}, seed=tid,
                                  parent_trial_id=parent, parent_checkpoint=start[1] if parent else None,
                                  search_round=born) == tid
        for i, loss in enumerate(losses):
            steps = start[0] + (i + 1) * LENGTH
            store.add_metrics(trial_id=tid, group="validation", steps_completed=steps,
                              metrics={"validation_loss": loss})
            store.add_checkpoint(uuid=CHECKPOINT.format(trial=tid, steps=steps), trial_id=tid, steps_completed=steps,
                                 metadata={"steps_completed": steps}, resources={"state.json": 10}, storage="shared_fs")
        store.set_trial_state(tid, "COMPLETED")
    store.set_experiment_state(exp, "COMPLETED")
    return store


def _rows(page: Any, round_: int) -> list[dict[str, str]]:
    """The lineage table of ``round_``: per row its trial id, parent cell, parent-checkpoint cell and title."""
    return page.eval_on_selector_all(
        f'#lineage table.lineage[data-round="{round_}"] tbody tr',
        """rows => rows.map(r => ({id: r.dataset.id, trial: r.cells[0].textContent,
              parent: r.querySelector('[data-col="parent"]').textContent,
              parentLink: (r.querySelector('[data-col="parent"] a') || {}).href || null,
              checkpoint: r.querySelector('[data-col="parent-checkpoint"]').textContent,
              title: r.querySelector('[data-col="parent-checkpoint"]').getAttribute('title')}))""")


def test_a_pbt_experiment_shows_best_so_far_and_its_lineage_by_round(tmp_path: Path, watched: Watched) -> None:
    run_dir = tmp_path / "runs"
    _pbt_run(run_dir).close()
    page = watched.page
    with running_ui(run_dir) as (base, token):
        page.goto(login_url(base, token, "/experiments/1"))
        page.wait_for_selector('#lineage table.lineage[data-round="3"] tbody tr')
        page.wait_for_selector('#best-so-far polyline[data-series="best"]')

        # best so far by trial number: one point per trial with a value (trial 4 has none), never getting worse
        assert "Best validation_loss so far" in str(page.text_content("#best-so-far .chart-title"))
        points = str(page.get_attribute('#best-so-far polyline[data-series="best"]', "points")).split()
        xs = [float(p.split(",")[0]) for p in points]
        ys = [float(p.split(",")[1]) for p in points]
        assert len(points) == 5 and xs == sorted(xs) and len(set(xs)) == 5
        # svg y grows downwards: a smaller best is drawn lower; bests 0.45 0.26 0.26 0.2 0.2 (by trial 1,2,3,5,6)
        assert ys[0] < ys[1] == ys[2] < ys[3] == ys[4]
        gaps = [b - a for a, b in zip(xs, xs[1:])]  # x is the trial number: 1 2 3 5 6 (a gap where trial 4 is)
        assert gaps[2] == pytest.approx(2 * gaps[0], abs=0.2) and gaps[0] == pytest.approx(gaps[1], abs=0.2)

        # one table per round, its trials in order, each child's parent and starting checkpoint
        captions = page.eval_on_selector_all("#lineage table.lineage caption", "cs => cs.map(c => c.textContent)")
        assert [re.match(r"Round (\d+)", c).group(1) for c in captions] == ["1", "2", "3"]  # type: ignore[union-attr]
        first = _rows(page, 1)
        assert [r["id"] for r in first] == ["1", "2", "3", "4"] and [r["trial"] for r in first] == ["1", "2", "3", "4"]
        assert all(r["parent"] == "—" and r["checkpoint"] == "—" and r["parentLink"] is None for r in first)
        for round_, child, parent in ((2, 5, 2), (3, 6, 5)):
            (row,) = _rows(page, round_)
            uuid = CHECKPOINT.format(trial=parent, steps=(round_ - 1) * LENGTH)
            assert (row["id"], row["parent"], row["checkpoint"], row["title"]) == (str(child), str(parent), uuid, uuid)
            assert row["parentLink"] == f"{base}/trials/{parent}"
        best_cells = page.eval_on_selector_all('#lineage tbody tr', "rs => rs.map(r => r.cells[4].textContent)")
        assert best_cells == ["0.45", "0.26", "0.7", "", "0.2", "0.25"]
        assert "lr=0.05" in str(page.text_content('#lineage tr[data-id="5"]'))
        assert "opt.name=sgd" in str(page.text_content('#lineage tr[data-id="5"]'))
        watched.assert_same_origin(base)
