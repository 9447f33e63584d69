"""A stand-in for NVIDIA's ``pynvml`` module (nvidia-ml-py), for testing the NVML path on machines without a GPU.

It answers the calls nbtrain makes with a small, configurable set of boards, counts the calls (to check
what is cached) and raises NVML's "Not Supported" where a board lacks a field (MIG, some VMs). Most readings
are one row of :data:`READINGS` (a board's field, and which item of it); NVLink counters, MIG instances and
Xid events (``module.xid(gpu, code)`` raises one) have a few lines each. It is not
NVML: it only lets the tests check what nbtrain does with NVML's answers and errors. The real library
is checked on a GPU machine (docs/gpu-verification.md).

``install`` is the way in: it makes ``import pynvml`` return the stand-in and resets every cache nbtrain
keeps of the previous driver's answers. Another process (a node agent) gets it with :func:`process_env`: its
``import pynvml`` finds ``helpers/nvml_process/pynvml.py``, which builds the stand-in over the boards the
environment describes (:func:`from_table`).
"""

from __future__ import annotations

import json
import os
import queue
import sys
import time
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


class NVMLError_NotFound(NVMLError):
    def __str__(self):
        return "Not Found"


class NVMLError_Timeout(NVMLError):
    def __str__(self):
        return "Timeout"


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
    nvlinks: tuple | None = None  # each link's state (1 up, 0 down); None: no NVLink (PCIe boards)
    nvlink_kib_s: tuple | None = (0, 0)  # NVLink rx, tx KiB/s: the counters grow so with time; None: not counted
    mig_devices: list | None = None  # with mig: its instances (FakeGpu each, with a "MIG-…" uuid)
    xid_events: bool = True  # False: registering for Xid events is not supported
    switch: int = 0  # GPUs with the same switch are under one PCIe switch (NVML topology 10), others across (50)
    nvlink_peers: tuple = ()  # the indices of GPUs this one reaches over NVLink (P2P status OK)
    gpm: tuple | None = (50.0, 30.0, 20.0, 10.0)  # GPM's SM active, occupancy, tensor active, DRAM bandwidth (%)
    # over the next interval, each None where NVML cannot compute it; None: no GPM (boards before Hopper)


# NVML function -> (FakeGpu field, the item of it answered or None for all of it); a None field: Not Supported
READINGS = {
    "nvmlDeviceGetPowerUsage": ("power_mw", None),
    "nvmlDeviceGetClockInfo": ("sm_clock", None),
    "nvmlDeviceGetMaxClockInfo": ("sm_clock_max", None),
    "nvmlDeviceGetCurrentClocksEventReasons": ("clock_reasons", None),
    "nvmlDeviceGetCurrPcieLinkGeneration": ("pcie", 0),
    "nvmlDeviceGetMaxPcieLinkGeneration": ("pcie", 1),
    "nvmlDeviceGetCurrPcieLinkWidth": ("pcie", 2),
    "nvmlDeviceGetMaxPcieLinkWidth": ("pcie", 3),
}


def make_module(gpus: list[FakeGpu]) -> types.ModuleType:
    """A ``pynvml`` look-alike over ``gpus``; ``module.calls`` counts the calls by function name."""
    calls: Counter = Counter()
    mod = types.ModuleType("pynvml")
    mod.calls = calls
    mod.nvmlMemory_v2 = 0x02000028
    mod.gpus = gpus
    mod.NVMLError = NVMLError
    mod.NVMLError_NotSupported = NVMLError_NotSupported
    mod.NVMLError_NotFound = NVMLError_NotFound
    mod.NVMLError_Timeout = NVMLError_Timeout
    mod.nvmlEventTypeXidCriticalError = 0x8
    mod.NVML_NVLINK_MAX_LINKS = 18
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
    def nvmlDeviceGetPcieThroughput(gpu, counter):
        return unsupported_unless(gpu.pcie_kb)[1 - counter]  # NVML_PCIE_UTIL_TX_BYTES = 0, RX_BYTES = 1

    @counted
    def nvmlDeviceGetTotalEccErrors(gpu, error_type, counter):
        return unsupported_unless(gpu.ecc)[error_type]

    for name, (attribute, item) in READINGS.items():
        def reading(gpu, *args, attribute=attribute, item=item):
            value = unsupported_unless(getattr(gpu, attribute))
            return value if item is None else value[item]
        reading.__name__ = name
        counted(reading)

    @counted
    def nvmlDeviceGetNvLinkState(gpu, link):
        states = unsupported_unless(gpu.nvlinks)
        if link >= len(states):
            raise NVMLError("Invalid Argument")
        return states[link]

    @counted
    def nvmlDeviceGetFieldValues(gpu, field_ids):
        rx, tx = unsupported_unless(gpu.nvlink_kib_s)
        when = time.time()
        counters = {139: int(rx * when), 138: int(tx * when)}  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX / _TX
        return [types.SimpleNamespace(nvmlReturn=0, timestamp=int(when * 1e6),
                                      value=types.SimpleNamespace(ullVal=counters[field_id]))
                for field_id, _ in field_ids]

    @counted
    def nvmlDeviceGetMaxMigDeviceCount(gpu):
        unsupported_unless(gpu.mig_devices)
        return 7  # an H100's slots

    @counted
    def nvmlDeviceGetMigDeviceHandleByIndex(gpu, index):
        if index >= len(gpu.mig_devices):
            raise NVMLError_NotFound()
        return gpu.mig_devices[index]

    event_sets: list = []

    @counted
    def nvmlEventSetCreate():
        event_set = types.SimpleNamespace(gpus=[], events=queue.Queue())
        event_sets.append(event_set)
        return event_set

    @counted
    def nvmlDeviceRegisterEvents(gpu, kinds, event_set):
        if not gpu.xid_events or kinds != mod.nvmlEventTypeXidCriticalError:
            raise NVMLError_NotSupported()
        event_set.gpus.append(gpu)

    def nvmlEventSetWait_v2(event_set, timeout_ms):  # not counted: it waits on its own thread
        try:
            return event_set.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError_Timeout() from None

    mod.nvmlEventSetWait_v2 = nvmlEventSetWait_v2

    @counted
    def nvmlEventSetFree(event_set):
        event_sets.remove(event_set)

    _gpm_module(mod, counted)

    @counted
    def nvmlDeviceGetTopologyCommonAncestor(first, second):
        return 0 if first is second else 10 if first.switch == second.switch else 50

    @counted
    def nvmlDeviceGetP2PStatus(first, second, caps):
        return 0 if gpus.index(second) in first.nvlink_peers else 4  # NVML_P2P_STATUS_NOT_SUPPORTED


    def xid(gpu, code):
        """The driver reports Xid ``code`` on ``gpu`` (to every event set it is registered in)."""
        for event_set in event_sets:
            if gpu in event_set.gpus:
                event_set.events.put(types.SimpleNamespace(device=gpu, eventType=0x8, eventData=code))

    mod.xid = xid
    return mod


GPM_IDS = {2: 0, 3: 1, 5: 2, 10: 3}  # NVML_GPM_METRIC_* -> the item of FakeGpu.gpm


class _GpmMetric:
    def __init__(self) -> None:
        self.metricId, self.nvmlReturn, self.value = 0, 0, 0.0


class _GpmMetricsGet:
    """``c_nvmlGpmMetricsGet_t``: what nbtrain fills in, and NVML answers in."""

    def __init__(self) -> None:
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [_GpmMetric() for _ in range(16)]


def _gpm_module(mod, counted) -> None:
    """GPM's calls: a sample holds the board's ``gpm`` values when it was taken; the metrics between two samples
    are the second one's (NVML_ERROR_NOT_SUPPORTED, 3, where a value is None)."""
    mod.NVML_GPM_METRICS_GET_VERSION = 1
    mod.c_nvmlGpmMetricsGet_t = _GpmMetricsGet
    mod.gpm_samples = []  # every sample allocated, and whether it was freed

    @counted
    def nvmlGpmQueryDeviceSupport(gpu):
        return types.SimpleNamespace(version=1, isSupportedDevice=int(gpu.gpm is not None))

    @counted
    def nvmlGpmSampleAlloc():
        sample = types.SimpleNamespace(gpu=None, values=None, freed=False)
        mod.gpm_samples.append(sample)
        return sample

    @counted
    def nvmlGpmSampleGet(gpu, sample):
        if gpu.gpm is None:
            raise NVMLError_NotSupported()
        sample.gpu, sample.values = gpu, gpu.gpm
        return sample

    @counted
    def nvmlGpmSampleFree(sample):
        sample.freed = True

    @counted
    def nvmlGpmMetricsGet(request):
        first, second = request.sample1, request.sample2
        if first.gpu is None or first.gpu is not second.gpu or request.version != 1:
            raise NVMLError("Invalid Argument")
        for metric in request.metrics[:request.numMetrics]:
            value = second.values[GPM_IDS[metric.metricId]]
            metric.nvmlReturn, metric.value = (3, 0.0) if value is None else (0, float(value))
        return request


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


def from_table(rows: list[dict]) -> list[FakeGpu]:
    """Boards from plain dicts of :class:`FakeGpu`'s fields (a MIG board's ``mig_devices`` as dicts too)."""
    return [FakeGpu(**{**row, "mig_devices": from_table(row["mig_devices"]) if row.get("mig_devices") else None})
            for row in rows]


TABLE_VARIABLE = "NBTRAIN_TEST_FAKE_GPUS"


def process_env(rows: list[dict]) -> dict:
    """Variables that make a child process's ``import pynvml`` the stand-in over the boards ``rows`` describe."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join([os.path.join(here, "nvml_process"), os.path.dirname(here), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, TABLE_VARIABLE: json.dumps(rows)}
