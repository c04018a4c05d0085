"""Device and process telemetry: pynvml on NVIDIA GPUs, process and host figures otherwise."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["Telemetry", "Sample"]


@dataclass(frozen=True, slots=True)
class Sample:
    device_mem_bytes: int
    device_util: float
    power_w: float
    cpu_percent: float
    rss_bytes: int
    source: str


class Telemetry:
    """Reads one sample per call; uses NVML for ``device_index`` when a GPU is present."""

    def __init__(self, device_index: int | None = None) -> None:
        import psutil

        self._proc = psutil.Process(os.getpid())
        self._proc.cpu_percent(None)
        self._nvml: Any = None
        self._handle: Any = None
        if device_index is not None:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
                self._nvml = pynvml
            except Exception:  # no driver / no GPU: fall back to process figures
                self._nvml = None

    @property
    def source(self) -> str:
        return "nvml" if self._nvml is not None else "process"

    def sample(self) -> Sample:
        cpu = float(self._proc.cpu_percent(None))
        rss = int(self._proc.memory_info().rss)
        if self._nvml is None:
            return Sample(device_mem_bytes=rss, device_util=min(cpu / 100.0 / (os.cpu_count() or 1), 1.0),
                          power_w=0.0, cpu_percent=cpu, rss_bytes=rss, source="process")
        nv = self._nvml
        mem = nv.nvmlDeviceGetMemoryInfo(self._handle)
        util = nv.nvmlDeviceGetUtilizationRates(self._handle)
        try:
            power = nv.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
        except Exception:
            power = 0.0
        return Sample(device_mem_bytes=int(mem.used), device_util=min(util.gpu / 100.0, 1.0),
                      power_w=float(power), cpu_percent=cpu, rss_bytes=rss, source="nvml")
