"""GPU utilization and memory from `amdsmi` (or the `rocm-smi` CLI).

The gauges exist only when one of those is present and reports a GPU: a
missing reading must look missing to Prometheus, not like an idle GPU.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuSample:
    gpu: str
    utilization_percent: float | None
    memory_used_bytes: float | None


GpuReader = Callable[[], list[GpuSample]]


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None  # "N/A" and friends


def parse_rocm_smi_json(text: str) -> list[GpuSample]:
    """`rocm-smi --showuse --showmeminfo vram --json` -> one sample per card."""
    data = json.loads(text)
    samples = []
    for card, fields in sorted(data.items()):
        if not card.startswith("card") or not isinstance(fields, dict):
            continue
        samples.append(
            GpuSample(
                gpu=card.removeprefix("card"),
                utilization_percent=_number(fields.get("GPU use (%)")),
                memory_used_bytes=_number(fields.get("VRAM Total Used Memory (B)")),
            )
        )
    return samples


def rocm_smi_reader(binary: str) -> GpuReader:
    def read() -> list[GpuSample]:
        out = subprocess.run(
            [binary, "--showuse", "--showmeminfo", "vram", "--json"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
        return parse_rocm_smi_json(out)

    return read


def amdsmi_reader(amdsmi: Any) -> GpuReader:
    handles = amdsmi.amdsmi_get_processor_handles()

    def read() -> list[GpuSample]:
        samples = []
        for index, handle in enumerate(handles):
            try:
                activity = amdsmi.amdsmi_get_gpu_activity(handle)
                util = _number(activity.get("gfx_activity"))
            except Exception:  # amdsmi raises AmdSmiLibraryException per query
                util = None
            try:
                used = _number(amdsmi.amdsmi_get_gpu_memory_usage(handle, amdsmi.AmdSmiMemoryType.VRAM))
            except Exception:
                used = None
            samples.append(GpuSample(str(index), util, used))
        return samples

    return read


def detect_gpu_reader() -> GpuReader | None:
    """amdsmi first, then rocm-smi; None when neither reports a GPU."""
    try:
        import amdsmi  # type: ignore[import-not-found]

        amdsmi.amdsmi_init()
        reader = amdsmi_reader(amdsmi)
        if reader():
            log.info("GPU metrics from amdsmi")
            return reader
    except Exception as exc:  # ImportError, or no driver / no device
        log.debug("amdsmi unavailable: %s", exc)
    binary = shutil.which("rocm-smi")
    if binary:
        reader = rocm_smi_reader(binary)
        try:
            if reader():
                log.info("GPU metrics from %s", binary)
                return reader
        except Exception as exc:
            log.debug("rocm-smi unusable: %s", exc)
    log.info("no amdsmi or rocm-smi GPU found: GPU metrics are not exported")
    return None


class GpuCollector(Collector):
    """Reads the GPUs at scrape time, at most once per `ttl` seconds."""

    def __init__(self, reader: GpuReader, ttl: float = 2.0) -> None:
        self._reader = reader
        self._ttl = ttl
        self._lock = threading.Lock()
        self._cached: tuple[float, list[GpuSample]] | None = None

    def _samples(self) -> list[GpuSample]:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] > self._ttl:
                try:
                    self._cached = (now, self._reader())
                except Exception as exc:
                    log.warning("GPU metrics read failed: %s", exc)
                    self._cached = (now, [])
            return self._cached[1]

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Static description so registration does not query the GPU.
        yield GaugeMetricFamily("model_server_gpu_utilization_percent", "GPU busy percent.", labels=["gpu"])
        yield GaugeMetricFamily("model_server_gpu_memory_used_bytes", "GPU VRAM in use.", labels=["gpu"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        samples = self._samples()
        util = GaugeMetricFamily("model_server_gpu_utilization_percent", "GPU busy percent.", labels=["gpu"])
        mem = GaugeMetricFamily("model_server_gpu_memory_used_bytes", "GPU VRAM in use.", labels=["gpu"])
        for s in samples:
            if s.utilization_percent is not None:
                util.add_metric([s.gpu], s.utilization_percent)
            if s.memory_used_bytes is not None:
                mem.add_metric([s.gpu], s.memory_used_bytes)
        yield util
        yield mem
