"""Smoke test of ``benchmarks/stream_resume.py --quick``, in this process (a few seconds): it runs end to end
and returns every figure it reports (no timing checks)."""

from __future__ import annotations

import importlib

import pytest
from support.helpers_paths import REPO

pytestmark = pytest.mark.usefixtures("cpu_device")


def test_stream_resume_benchmark_quick_run_reports_its_figures(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    result = importlib.import_module("stream_resume").main(["--quick"])
    for name in ("state", "replay"):
        assert set(result["resume_s"][name]) == {"near", "deep"}
        assert result["resume_deep_over_near"][name] > 0
    assert set(result["per_batch_us"]) == {"det", "stateful", "torch"}
    assert result["det_over_stateful"] > 0 and result["det_over_torch"] > 0
    assert "per batch, det / StatefulDataLoader (median of 2 per-round ratios): " in capsys.readouterr().out
