"""What the machine is doing right now: each GPU's load, memory and processes, plus CPU and RAM.

:func:`machine_snapshot` is what the ``/nbtrain/gpus`` route returns. It reads NVML through
:mod:`nbtrain.gpu.nvml` (the one NVML wrapper; it never initialises CUDA) and psutil. Without a GPU or
driver, ``gpus`` is empty and ``gpu_error`` says why; CPU and RAM are always there, so the status bar can
show "CPU 12% · RAM 5/24 GiB" instead.

It blocks (NVML and /proc reads take milliseconds, more on a busy machine): the server calls it in a
thread pool, never on the event loop.

Snapshot (JSON; bytes for memory, percent for load)::

    {"time": 1760000000.0, "gpu_error": null | "NVMLError_LibraryNotFound: …",
     "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-…", "utilization": 73,
               "memory_used": 44023414784, "memory_total": 85899345920, "temperature": 51,
               "processes": [{"pid": 456, "memory_used": 40000000000 | null}]}],
     "cpu": {"percent": 12.5, "count": 16}, "ram": {"used": 5368709120, "total": 25769803776}}
"""

from __future__ import annotations

import threading
import time

import psutil

from nbtrain.gpu import nvml


def machine_snapshot() -> dict:
    gpus = gpu_states()
    memory = psutil.virtual_memory()
    return {
        "time": time.time(),
        "gpu_error": None if gpus else (nvml.unavailable_reason() or "no NVIDIA GPU found"),
        "gpus": gpus,
        "cpu": {"percent": _cpu.percent(), "count": psutil.cpu_count()},
        "ram": {"used": memory.total - memory.available, "total": memory.total},
    }


def gpu_states() -> list[dict]:
    """The ``gpus`` part of the snapshot alone (what the process list needs)."""
    return [_gpu_state(gpu) for gpu in nvml.all_gpus()]


def prime_cpu() -> None:
    """Start the CPU clock so the first snapshot's percentage covers a real interval."""
    _cpu.percent()


class _CpuMeter:
    """System CPU load over the time since the last sample, sampled at most every MIN_INTERVAL_S.

    psutil measures from one call to the next; two browser tabs asking a millisecond apart would
    otherwise get a load measured over a millisecond (0 % or 100 %).
    """

    MIN_INTERVAL_S = 0.5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0.0
        self._at = 0.0

    def percent(self) -> float:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.MIN_INTERVAL_S:
                self._value = psutil.cpu_percent(interval=None)
                self._at = now
            return self._value


_cpu = _CpuMeter()


def _gpu_state(gpu: nvml.GpuInfo) -> dict:
    lib = nvml.library()
    handle = nvml.query(lib.nvmlDeviceGetHandleByIndex, gpu.index)
    memory = nvml.query(lib.nvmlDeviceGetMemoryInfo, handle) if handle is not None else None
    rates = nvml.query(lib.nvmlDeviceGetUtilizationRates, handle) if handle is not None else None
    temperature = None
    if handle is not None and hasattr(lib, "NVML_TEMPERATURE_GPU"):
        temperature = nvml.query(lib.nvmlDeviceGetTemperature, handle, lib.NVML_TEMPERATURE_GPU)
    return {
        "index": gpu.index, "name": gpu.name, "uuid": gpu.uuid,
        "utilization": getattr(rates, "gpu", None),
        "memory_used": getattr(memory, "used", None),
        "memory_total": getattr(memory, "total", gpu.memory_total),
        "temperature": temperature,
        "processes": _gpu_processes(lib, handle) if handle is not None else [],
    }


def _gpu_processes(lib, handle) -> list[dict]:
    """Compute and graphics processes on one GPU, one entry per pid (a process may appear in both lists)."""
    found: dict[int, dict] = {}
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(lib, getter, None)
        for proc in (nvml.query(fn, handle, default=[]) if fn else []):
            used = getattr(proc, "usedGpuMemory", None)
            # NVML reports "not available" (inside containers, without privileges) as None or a huge sentinel.
            if not isinstance(used, int) or used < 0 or used >= 2**63:
                used = None
            entry = found.setdefault(proc.pid, {"pid": proc.pid, "memory_used": used})
            if entry["memory_used"] is None:
                entry["memory_used"] = used
    return sorted(found.values(), key=lambda p: p["pid"])
