"""ProfilerContext: system metrics (CPU, memory, disk and network I/O, GPU where present) in a thread.

Samples are taken every ``sampling_interval`` seconds by a background thread on each node's local
chief, averaged over ``samples_per_report`` samples and reported as the metrics group ``system``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from determined_trials.core._distributed import DistributedContext

__all__ = ["SYSTEM_METRICS_GROUP", "ProfilerContext", "sample_system"]

logger = logging.getLogger("determined_trials.core")

SYSTEM_METRICS_GROUP = "system"
_MB = 1024.0 * 1024.0

Reporter = Callable[[str, int, dict[str, Any]], None]


def sample_system() -> dict[str, float]:
    """One reading of the cumulative counters and gauges the profiler turns into rates."""
    memory = psutil.virtual_memory()
    disk = psutil.disk_io_counters()
    net = psutil.net_io_counters()
    reading = {
        "time": time.monotonic(),
        "cpu_util_percent": psutil.cpu_percent(interval=None),
        "memory_used_gb": memory.used / 1024.0**3,
        "memory_available_gb": memory.available / 1024.0**3,
        "disk_read_bytes": float(disk.read_bytes) if disk else 0.0,
        "disk_write_bytes": float(disk.write_bytes) if disk else 0.0,
        "net_sent_bytes": float(net.bytes_sent) if net else 0.0,
        "net_recv_bytes": float(net.bytes_recv) if net else 0.0,
    }
    reading.update(_gpu_reading())
    return reading


def _gpu_reading() -> dict[str, float]:
    """GPU utilisation and memory through NVML when ``pynvml`` is installed and a GPU is present."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        out: dict[str, float] = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            out[f"gpu{index}_util_percent"] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            out[f"gpu{index}_memory_used_gb"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 1024.0**3
        return out
    except Exception:  # no driver / no device: the profiler reports what it can
        return {}


def _summarise(samples: list[dict[str, float]]) -> dict[str, float]:
    """Gauge averages and counter rates (MB/s) over samples; the first sample is the previous report's last."""
    first, last = samples[0], samples[-1]
    elapsed = max(last["time"] - first["time"], 1e-9)
    gauges = [k for k in last if not k.endswith("_bytes") and k != "time"]
    window = samples[1:] or samples
    summary = {key: sum(s.get(key, 0.0) for s in window) / len(window) for key in gauges}
    for key in ("disk_read", "disk_write", "net_sent", "net_recv"):
        summary[f"{key}_mb_per_s"] = (last[f"{key}_bytes"] - first[f"{key}_bytes"]) / _MB / elapsed
    return summary


class ProfilerContext:
    """Turns system-metrics collection on and off; only a node's local chief collects."""

    def __init__(self, dist: DistributedContext, report: Reporter) -> None:
        self._dist = dist
        self._report = report
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reports_sent = 0

    @property
    def is_on(self) -> bool:
        """True while the sampling thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def on(self, sampling_interval: float = 1, samples_per_report: int = 10) -> None:
        """Start sampling every ``sampling_interval`` s, reporting every ``samples_per_report`` samples."""
        if sampling_interval <= 0 or samples_per_report < 1:
            raise ValueError("sampling_interval must be > 0 and samples_per_report >= 1")
        if self.is_on or self._dist.get_local_rank() != 0:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(float(sampling_interval), int(samples_per_report)),
            name="det-profiler", daemon=True,
        )
        self._thread.start()

    def off(self) -> None:
        """Stop sampling (what was sampled since the last report is reported); idempotent."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None

    def _run(self, interval: float, per_report: int) -> None:
        psutil.cpu_percent(interval=None)  # the first call only primes the counter
        previous = sample_system()
        samples: list[dict[str, float]] = []
        while not self._stop.wait(interval):
            samples.append(sample_system())
            if len(samples) >= per_report:
                self._send([previous, *samples])
                previous, samples = samples[-1], []
        if samples:
            self._send([previous, *samples])

    def _send(self, samples: list[dict[str, float]]) -> None:
        summary = _summarise(samples)
        try:
            self._report(SYSTEM_METRICS_GROUP, self._reports_sent, summary)
            self._reports_sent += 1
        except Exception:
            logger.exception("could not report system metrics")
