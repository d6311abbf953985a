"""Compiled fits under different ``use_amp`` dtypes in one process and one compile cache: each computes in
its own dtype. Before torch 2.13 AOTAutograd's cache key says whether autocast is on but not its dtype, so
a float16 run was served the bfloat16 run's graphs (on CUDA: "Found dtype Float but expected BFloat16" in
backward; on the CPU: silently bfloat16 numbers); the harness turns that cache off there. Here the old key
is simulated on the installed torch; the CPU and inductor, whose cache it is."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from torch._functorch import config as functorch_config
from torch._functorch._aot_autograd import autograd_cache
from trials_pytorch import ResumeTrial, assert_same_state, config, fit, state_snapshot

from determined_trials.pytorch import Batch
from determined_trials.pytorch.device import _amp

pytestmark = pytest.mark.usefixtures("cpu_device", "fresh_dynamo")

CONF = config({"global_batch_size": 4, "lr": 0.01, "hidden": 8})


@pytest.fixture
def old_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """AOTAutograd's cache key as torch < 2.13 makes it: no autocast dtype in it."""
    details = autograd_cache.AOTAutogradCacheDetails
    record = details._record_runtime_state

    def without_autocast_dtype(self: Any, gm: Any) -> None:
        record(self, gm)
        self.autocast_state = {}

    monkeypatch.setattr(details, "_record_runtime_state", without_autocast_dtype)


@pytest.fixture
def cache_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """AOTAutograd's cache on (restored after), in an empty folder, and the harness's check not yet made."""
    monkeypatch.setattr(_amp, "_cache_checked", False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "compile-cache"))
    counters.clear()
    with functorch_config.patch(enable_autograd_cache=True):  # torch's config: not monkeypatch-able
        yield
    counters.clear()


def _compiled_fit(run_dir: Path, dtype: torch.dtype) -> Any:
    trial, trainer, _ = fit(lambda ctx: ResumeTrial(ctx, amp_dtype=dtype, compile_backend="inductor"), CONF, run_dir,
                            max_length=Batch(4))
    assert trainer.exit_reason is not None and trainer.exit_reason.value == "completed"
    return state_snapshot(trial)


def _float16_after_bfloat16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, int]:
    """(the float16 fit's state after a bfloat16 fit, the same fit's alone in a fresh cache and dynamo,
    AOTAutograd cache hits in the float16 fit after the bfloat16 one)."""
    _compiled_fit(tmp_path / "bf16", torch.bfloat16)
    torch._dynamo.reset()
    counters.clear()
    after = _compiled_fit(tmp_path / "fp16-after", torch.float16)
    hits = counters["aot_autograd"]["autograd_cache_hit"]
    torch._dynamo.reset()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "fresh-cache"))
    alone = _compiled_fit(tmp_path / "fp16-alone", torch.float16)
    return after, alone, hits


@pytest.mark.slow
@pytest.mark.usefixtures("old_cache_key", "cache_on")
def test_with_the_old_key_a_float16_fit_gets_the_bfloat16_graphs_when_the_cache_stays_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: the simulated key does reproduce torch's bug (so the next test can fail)."""
    monkeypatch.setattr(_amp, "_CACHE_KEYS_AUTOCAST_DTYPE", "0.0")  # the harness takes this torch as fixed
    after, alone, hits = _float16_after_bfloat16(tmp_path, monkeypatch)
    assert hits > 0
    with pytest.raises(AssertionError, match="differs"):
        assert_same_state(after, alone)


@pytest.mark.slow
@pytest.mark.usefixtures("old_cache_key", "cache_on")
def test_with_the_old_key_a_float16_fit_after_a_bfloat16_fit_computes_in_float16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(_amp, "_CACHE_KEYS_AUTOCAST_DTYPE", "99.0")  # the harness takes this torch as affected
    with caplog.at_level(logging.INFO, logger="determined_trials.pytorch"):
        after, alone, hits = _float16_after_bfloat16(tmp_path, monkeypatch)
    assert hits == 0 and functorch_config.enable_autograd_cache is False
    assert_same_state(after, alone)
    assert sum("AOTAutograd's compile cache is off" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.usefixtures("cache_on")
def test_on_a_torch_whose_key_holds_the_dtype_the_cache_stays_on() -> None:
    if torch.__version__ < "2.13":
        pytest.skip(f"torch {torch.__version__}'s AOTAutograd cache key lacks the autocast dtype")
    _amp.make_autocast(torch.device("cpu"), torch.bfloat16, True)
    assert functorch_config.enable_autograd_cache is True


@pytest.mark.usefixtures("cache_on")
def test_a_disabled_autocast_leaves_the_cache_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_amp, "_CACHE_KEYS_AUTOCAST_DTYPE", "99.0")
    _amp.make_autocast(torch.device("cpu"), torch.bfloat16, False)
    assert functorch_config.enable_autograd_cache is True
    _amp.make_autocast(torch.device("cpu"), torch.bfloat16, True)
    assert functorch_config.enable_autograd_cache is False
