"""A stand-in for NVIDIA's ``pynvml`` module (nvidia-ml-py) with a configurable set of GPUs.

Used only where there is no GPU: the real library is checked on a GPU machine (docs/gpu-verification.md).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field


class NVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    total: int = 80 * 2**30
    used: int = 2 * 2**30
    util: int = 40
    temp: int = 50
    power_mw: int = 200_000
    limit_mw: int = 700_000
    processes: list = field(default_factory=list)  # [(pid, used_bytes)]


def make_module(gpus: list[FakeGpu]) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    m.nvmlDeviceGetName = lambda h: h.name
    m.nvmlDeviceGetUUID = lambda h: h.uuid
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=h.util, memory=0)
    m.nvmlDeviceGetTemperature = lambda h, sensor: h.temp
    m.NVML_TEMPERATURE_GPU = 0
    m.nvmlDeviceGetPowerUsage = lambda h: h.power_mw
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: h.limit_mw
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in h.processes]
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    m.nvmlDeviceGetMigMode = lambda h: (0, 0)
    m.NVML_DEVICE_MIG_ENABLE = 1
    return m


def install(monkeypatch, gpus: list[FakeGpu]) -> types.ModuleType:
    """Make ``import pynvml`` return the stand-in and reset nbtrain's lazily initialised NVML state."""
    import sys

    from nbtrain.gpu import nvml, telemetry
    from nbtrain.server import gpus as server_gpus

    module = make_module(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(nvml, "_state", {"module": None, "error": None, "tried": False})
    monkeypatch.setattr(telemetry, "_default", None)
    monkeypatch.setattr(server_gpus, "_last", None)
    return module
