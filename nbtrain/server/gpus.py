"""What the machine is doing right now: each GPU's load, memory and processes, plus CPU and RAM.

:func:`machine_snapshot` is what the ``/nbtrain/gpus`` route returns. It is the dashboard's
telemetry (:mod:`nbtrain.gpu.telemetry`: NVML through the one wrapper, never CUDA; psutil for CPU/RAM) as JSON. Without a GPU or
driver, ``gpus`` is empty and ``gpu_error`` says why; CPU and RAM are always there, so the status bar can
show "CPU 12% · RAM 5/24 GiB" instead.

A GPU's ``processes`` is ``null`` when they are unknown: NVML cannot list them, or it lists none while
memory is in use (VMs and some containers hide them; :attr:`~nbtrain.gpu.devices.GpuStatus.processes_hidden`).
``memory_used`` is then what is in use, and ``notes`` says so once.

It blocks (NVML and /proc reads take milliseconds, more on a busy machine): the server calls it in a
thread pool, never on the event loop.

Snapshot (JSON; bytes for memory, percent for load)::

    {"time": 1760000000.0, "gpu_error": null | "NVMLError_LibraryNotFound: …",
     "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-…", "utilization": 73,
               "memory_used": 44023414784, "memory_total": 85899345920, "temperature": 51,
               "power": 310.5 | null, "power_limit": 700.0 | null,
               "processes": [{"pid": 456, "memory_used": 40000000000 | null}] | null}],
     "cpu": {"percent": 12.5, "count": 16}, "ram": {"used": 5368709120, "total": 25769803776},
     "notes": ["GPU 0: the driver lists no processes …"],
     "leases": [{"gpu": 0, "user": "bob", "notebook": "llm.ipynb" | null, "since": 1760000000.0 | null,
                 "state": "busy" | "idle-warm" | null, "mine": false}],
     "queue": [{"user": "carol", "since": 1760000100.0, "mine": false}],
     "lease_error": null | "the GPU lease directory … belongs to …"}

``leases`` and ``queue`` are every nbtrain kernel's on the machine, every user's (:mod:`.lease_rows`): what
another user sees of them is a user name and a notebook's file name.
"""

from __future__ import annotations

import threading
import time

from nbtrain.gpu import telemetry
from nbtrain.server.lease_rows import lease_rows

MIN_INTERVAL_S = 0.5


def machine_snapshot() -> dict:
    snap = _recent()
    return {
        "time": snap.time,
        "gpu_error": None if snap.gpus else (snap.nvml_error or "no NVIDIA GPU found"),
        "gpus": [_gpu_json(g) for g in snap.gpus],
        "cpu": {"percent": snap.host.cpu_percent, "count": snap.host.cpu_count},
        "ram": {"used": snap.host.memory_used, "total": snap.host.memory_total},
        "notes": list(snap.notes),
        **lease_rows(),
    }


def gpu_states() -> list[dict]:
    """The ``gpus`` part of the snapshot alone (what the process list needs)."""
    return machine_snapshot()["gpus"]


def prime_cpu() -> None:
    """Start the CPU clock so the first snapshot's percentage covers a real interval."""
    _recent()


_lock = threading.Lock()
_last: tuple[float, telemetry.Snapshot] | None = None


def _recent() -> telemetry.Snapshot:
    """The dashboard's telemetry, sampled at most every MIN_INTERVAL_S.

    CPU load is measured from one sample to the next; two browser tabs asking a millisecond apart would
    otherwise get a load measured over a millisecond (0 % or 100 %).
    """
    global _last
    with _lock:
        now = time.monotonic()
        if _last is None or now - _last[0] >= MIN_INTERVAL_S:
            _last = (now, telemetry.snapshot())
        return _last[1]


def _gpu_json(gpu: telemetry.GpuStatus) -> dict:
    return {
        "index": gpu.index, "name": gpu.name, "uuid": gpu.uuid, "utilization": gpu.utilization,
        "memory_used": gpu.memory_used, "memory_total": gpu.memory_total, "temperature": gpu.temperature,
        "power": gpu.power, "power_limit": gpu.power_limit,
        "processes": None if gpu.processes is None or gpu.processes_hidden
        else [{"pid": p.pid, "memory_used": p.used_memory} for p in gpu.processes],
    }
