"""A stand-in for NVIDIA's ``pynvml`` module (nvidia-ml-py), for testing the NVML path on machines without a GPU.

It answers the calls nbtrain makes with a small, configurable set of boards, counts the calls (to check
what is cached) and raises NVML's "Not Supported" where a board lacks a field (MIG, some VMs). It is not
NVML: it only lets the tests check what nbtrain does with NVML's answers and errors. The real library
is checked on a GPU machine (docs/gpu-verification.md).

``install`` is the way in: it makes ``import pynvml`` return the stand-in and resets every cache nbtrain
keeps of the previous driver's answers.
"""

from __future__ import annotations

import sys
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
    uuid: str | None = None  # None: "GPU-<index>-fake", from the board's place in the list
    total: int = 80 * 2**30
    used: int = 2 * 2**30  # what nvidia-smi calls used: the driver's reserve is apart (``reserved``)
    reserved: int = 0  # counted as used by the first memory call only, as real drivers do
    util: int | None = 40  # None: not supported
    temperature: int = 50
    power_mw: int | None = 200_000  # None: not supported
    limit_mw: int = 700_000
    processes: list | None = field(default_factory=list)  # [(pid, used bytes or None)]; None: not supported
    mig: bool = False
    sm_clock: int | None = 1980  # MHz; None: not supported (as the health fields below)
    sm_clock_max: int | None = 1980
    clock_reasons: int | None = 0  # nvmlClocksEventReason* bits
    pcie: tuple | None = (5, 5, 16, 16)  # generation, its maximum, width, its maximum
    pcie_kb: tuple | None = (1000, 500)  # rx, tx in KB/s
    ecc: tuple | None = (0, 0)  # volatile corrected, uncorrected; None: no ECC (consumer boards)


def make_module(gpus: list[FakeGpu]) -> types.ModuleType:
    """A ``pynvml`` look-alike over ``gpus``; ``module.calls`` counts the calls by function name."""
    calls: Counter = Counter()
    mod = types.ModuleType("pynvml")
    mod.calls = calls
    mod.nvmlMemory_v2 = 0x02000028
    mod.gpus = gpus
    mod.NVMLError = NVMLError
    mod.NVMLError_NotSupported = NVMLError_NotSupported
    mod.NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    mod.NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE

    def counted(fn):
        def wrapper(*args, **kwargs):
            calls[fn.__name__] += 1
            return fn(*args, **kwargs)
        wrapper.__name__ = fn.__name__
        setattr(mod, fn.__name__, wrapper)
        return wrapper

    def unsupported_unless(value):
        if value is None:
            raise NVMLError_NotSupported()
        return value

    @counted
    def nvmlInit():
        pass

    @counted
    def nvmlShutdown():
        pass

    @counted
    def nvmlDeviceGetCount():
        return len(gpus)

    @counted
    def nvmlDeviceGetHandleByIndex(index):
        return gpus[index]

    @counted
    def nvmlDeviceGetName(gpu):
        return gpu.name.encode()  # older bindings answer bytes; nbtrain decodes

    @counted
    def nvmlDeviceGetUUID(gpu):
        return gpu.uuid or f"GPU-{gpus.index(gpu):08d}-fake"

    @counted
    def nvmlDeviceGetMemoryInfo(gpu, version=None):
        used = gpu.used if version == mod.nvmlMemory_v2 else gpu.used + gpu.reserved
        return types.SimpleNamespace(total=gpu.total, used=used, free=gpu.total - used)

    @counted
    def nvmlDeviceGetUtilizationRates(gpu):
        util = unsupported_unless(None if gpu.mig else gpu.util)
        return types.SimpleNamespace(gpu=util, memory=util // 2)

    @counted
    def nvmlDeviceGetTemperature(gpu, sensor):
        assert sensor == NVML_TEMPERATURE_GPU
        return gpu.temperature

    @counted
    def nvmlDeviceGetPowerUsage(gpu):
        return unsupported_unless(gpu.power_mw)

    @counted
    def nvmlDeviceGetEnforcedPowerLimit(gpu):
        return gpu.limit_mw

    @counted
    def nvmlDeviceGetMigMode(gpu):
        return (1, 1) if gpu.mig else (0, 0)

    @counted
    def nvmlDeviceGetComputeRunningProcesses(gpu):
        listed = unsupported_unless(gpu.processes)
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in listed]

    @counted
    def nvmlDeviceGetGraphicsRunningProcesses(gpu):
        unsupported_unless(gpu.processes)
        return []

    @counted
    def nvmlDeviceGetClockInfo(gpu, clock):
        return unsupported_unless(gpu.sm_clock)

    @counted
    def nvmlDeviceGetMaxClockInfo(gpu, clock):
        return unsupported_unless(gpu.sm_clock_max)

    @counted
    def nvmlDeviceGetCurrentClocksEventReasons(gpu):
        return unsupported_unless(gpu.clock_reasons)

    @counted
    def nvmlDeviceGetCurrPcieLinkGeneration(gpu):
        return unsupported_unless(gpu.pcie)[0]

    @counted
    def nvmlDeviceGetMaxPcieLinkGeneration(gpu):
        return unsupported_unless(gpu.pcie)[1]

    @counted
    def nvmlDeviceGetCurrPcieLinkWidth(gpu):
        return unsupported_unless(gpu.pcie)[2]

    @counted
    def nvmlDeviceGetMaxPcieLinkWidth(gpu):
        return unsupported_unless(gpu.pcie)[3]

    @counted
    def nvmlDeviceGetPcieThroughput(gpu, counter):
        return unsupported_unless(gpu.pcie_kb)[1 - counter]  # NVML_PCIE_UTIL_TX_BYTES = 0, RX_BYTES = 1

    @counted
    def nvmlDeviceGetTotalEccErrors(gpu, error_type, counter):
        return unsupported_unless(gpu.ecc)[error_type]

    return mod


def install(monkeypatch, gpus: list[FakeGpu]) -> types.ModuleType:
    """Make ``import pynvml`` return a stand-in over ``gpus``; nbtrain's NVML state starts afresh, restored after."""
    from nbtrain.gpu import nvml, telemetry
    from nbtrain.server import gpus as server_gpus

    module = make_module(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(nvml, "_state", {"module": None, "error": None, "tried": False})  # and its GPUs
    monkeypatch.setattr(telemetry, "_default", None)
    monkeypatch.setattr(server_gpus, "_last", None)  # the server's last snapshot, of the previous driver
    return module
