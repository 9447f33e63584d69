"""A stand-in for NVIDIA's ``pynvml`` module, for testing the NVML path on machines without a GPU.

It answers the calls nbtrain makes with a small, configurable set of boards. It is not NVML: it only
lets the tests check what nbtrain does with NVML's answers (and with its errors).
"""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field

NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_ENABLE = 1


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    def __str__(self):
        return "Not Supported"


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * 2**30
    used: int = 2**30
    util: int | None = 50
    temperature: int = 40
    power_mw: int | None = 300_000
    limit_mw: int = 700_000
    processes: list | None = field(default_factory=list)  # [(pid, used bytes or None)]
    mig: bool = False


def make_module(gpus: list[FakeGpu]) -> types.ModuleType:
    calls: Counter = Counter()
    mod = types.ModuleType("pynvml")
    mod.calls = calls
    mod.gpus = gpus
    mod.NVMLError = NVMLError
    mod.NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    mod.NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE

    def counted(fn):
        def wrapper(*args):
            calls[fn.__name__] += 1
            return fn(*args)
        wrapper.__name__ = fn.__name__
        setattr(mod, fn.__name__, wrapper)
        return wrapper

    @counted
    def nvmlInit():
        pass

    @counted
    def nvmlDeviceGetCount():
        return len(gpus)

    @counted
    def nvmlDeviceGetHandleByIndex(index):
        return gpus[index]

    @counted
    def nvmlDeviceGetName(gpu):
        return gpu.name.encode()

    @counted
    def nvmlDeviceGetUUID(gpu):
        return f"GPU-{gpus.index(gpu):08d}-fake"

    @counted
    def nvmlDeviceGetMemoryInfo(gpu):
        return types.SimpleNamespace(total=gpu.total, used=gpu.used, free=gpu.total - gpu.used)

    @counted
    def nvmlDeviceGetUtilizationRates(gpu):
        if gpu.util is None or gpu.mig:
            raise NVMLError_NotSupported()
        return types.SimpleNamespace(gpu=gpu.util, memory=gpu.util // 2)

    @counted
    def nvmlDeviceGetTemperature(gpu, sensor):
        assert sensor == NVML_TEMPERATURE_GPU
        return gpu.temperature

    @counted
    def nvmlDeviceGetPowerUsage(gpu):
        if gpu.power_mw is None:
            raise NVMLError_NotSupported()
        return gpu.power_mw

    @counted
    def nvmlDeviceGetEnforcedPowerLimit(gpu):
        return gpu.limit_mw

    @counted
    def nvmlDeviceGetMigMode(gpu):
        return (1, 1) if gpu.mig else (0, 0)

    @counted
    def nvmlDeviceGetComputeRunningProcesses(gpu):
        if gpu.processes is None:
            raise NVMLError_NotSupported()
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

    @counted
    def nvmlDeviceGetGraphicsRunningProcesses(gpu):
        if gpu.processes is None:
            raise NVMLError_NotSupported()
        return []

    return mod
