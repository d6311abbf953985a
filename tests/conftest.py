"""Fixtures every test module may use: ``cpu_device`` for tests whose expectations hold on the CPU,
``device`` for tests run on each device (the CPU, and CUDA in the GPU tier), ``fresh_dynamo`` for tests
of ``torch.compile``d models; every test's time limit (pytest-timeout) grows with the machine's load."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.helpers_load import load_factor


@pytest.fixture
def cpu_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test needs the CPU: trial contexts built without ``device=`` pick the CPU even where CUDA is
    available, and child processes (launchers, workers) see no GPU and DeepSpeed's CPU accelerator."""
    import torch

    from determined_trials.deepspeed import _context as deepspeed_context
    from determined_trials.pytorch import _context as pytorch_context

    def cpu(local_rank: int, size: int) -> Any:
        return torch.device("cpu")

    monkeypatch.setattr(pytorch_context, "default_device", cpu)
    monkeypatch.setattr(deepspeed_context, "default_device", cpu)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    yield


@pytest.fixture(params=[pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> str:
    """The device the test's trials train on: "cpu" (forced with ``cpu_device``, wherever the tests run)
    or "cuda" (the default device where CUDA is available; a ``gpu`` case, skipped without CUDA)."""
    if request.param == "cpu":
        request.getfixturevalue("cpu_device")
    else:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
    return str(request.param)


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Compiled runs start from empty dynamo caches, and hitting the recompile limit (a silent fall back
    to uncompiled code, which would compare compiled numbers with eager ones) is an error."""
    import torch._dynamo

    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield
    torch._dynamo.reset()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """Scale the test's timeout by the load when it starts (``load_factor``): on a shared machine at load 10
    a 300 s limit that a quiet one never nears is 1,200 s. pytest-timeout's own hook then sets the timer."""
    factor = load_factor()
    if factor <= 1.0:
        return None  # pytest-timeout's hook, as configured
    import pytest_timeout

    pytest_timeout.pytest_timeout_set_timer(item, settings._replace(timeout=settings.timeout * factor))
    return True
