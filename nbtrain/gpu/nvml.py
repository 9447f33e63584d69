"""NVML, wrapped once: the only place nbtrain talks to the NVIDIA driver from the kernel.

Why NVML and not ``torch.cuda``: asking CUDA how many GPUs there are initialises the CUDA driver in the
notebook kernel, which is what later breaks forked workers ("Cannot re-initialize CUDA in forked
subprocess") and holds memory on GPU 0. NVML reads the same facts from the driver without a CUDA context.

* Initialised lazily, on the first query — never at import — and only once per process.
* The GPUs are enumerated once per process (:func:`all_gpus`), with what never changes about them
  (name, UUID, total memory, power limit, MIG mode) and their handles: the launcher counts GPUs with
  it, :mod:`nbtrain.gpu.devices` reads the changing fields through the same handles.
* Every query degrades instead of raising: no driver, no ``pynvml`` module, a field the GPU does not
  support (MIG, old boards) give ``None``, and the first failure of each kind is explained once through
  :func:`hint`.
* The module is ``pynvml`` as shipped by ``nvidia-ml-py`` (NVIDIA's bindings), not the deprecated
  ``pynvml`` package.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_lock = threading.Lock()
_enumeration_lock = threading.Lock()
# "gpus", once enumerated, is kept here too: replacing _state (as the tests do) forgets the driver and its GPUs
_state: dict[str, Any] = {"module": None, "error": None, "tried": False}
_hints: set[str] = set()
_hint_sink: list[Callable[[str], None]] = []


def hint(message: str) -> None:
    """Say ``message`` once per process (to the sinks registered by the UI, else stderr)."""
    if message in _hints:
        return
    _hints.add(message)
    for sink in _hint_sink or [lambda m: print(f"nbtrain: {m}", file=sys.stderr)]:
        sink(message)


def library():
    """The initialised ``pynvml`` module, or ``None`` when there is no usable NVIDIA driver."""
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            try:
                import pynvml

                pynvml.nvmlInit()
                _state["module"] = pynvml
            except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
                _state["error"] = f"{type(exc).__name__}: {exc}"
        return _state["module"]


def unavailable_reason() -> str | None:
    library()
    return _state["error"]


def query(fn: Callable[..., Any], *args, default=None, quiet: bool = False):
    """Call an NVML function; on any NVML error return ``default`` (a missing value, not a crash).

    ``quiet=True`` skips the one-time hint: for callers that poll every second and report what is
    missing themselves (the dashboard's telemetry shows such fields as N/A with its own note).
    """
    nvml = library()
    if nvml is None:
        return default
    try:
        return fn(*args)
    except Exception as exc:
        if not quiet:
            hint(f"NVML could not read {getattr(fn, '__name__', 'a value')} ({exc}); it is shown as N/A")
        return default


def memory_info(lib, handle, quiet: bool = False):
    """The GPU's memory (``total``, ``used``, ``free``) as nvidia-smi counts it: the second version of the call
    leaves the driver's reserve out of ``used`` (hundreds of MiB on a large GPU); the first where it is missing."""
    version = getattr(lib, "nvmlMemory_v2", None)
    if version is not None:
        memory = query(lambda: lib.nvmlDeviceGetMemoryInfo(handle, version=version), quiet=True)
        if memory is not None:
            return memory
    return query(lib.nvmlDeviceGetMemoryInfo, handle, quiet=quiet)


@dataclass(frozen=True)
class GpuInfo:
    """What never changes about a GPU while the process lives; read once (:func:`all_gpus`)."""

    index: int  # NVML (physical) index
    name: str
    uuid: str
    memory_total: int | None  # bytes
    power_limit: float | None = None  # watts, the enforced limit
    mig: bool = False  # MIG mode is on
    handle: Any = field(default=None, compare=False, repr=False)  # NVML's, for the readings that change
    sm_clock_max: int | None = None  # MHz
    pcie_gen_max: int | None = None  # the board's PCIe link: generation and lanes
    pcie_width_max: int | None = None


def optional(lib, name: str, *args):
    """A reading some bindings lack (older nvidia-ml-py): None then, as for a field the driver cannot give."""
    fn = getattr(lib, name, None)
    return None if fn is None else query(fn, *args, quiet=True)


def text(value) -> str:
    """NVML answers strings as ``bytes`` in some versions of the bindings and ``str`` in others."""
    return value.decode() if isinstance(value, bytes) else str(value)


def watts(milliwatts) -> float | None:
    return None if milliwatts is None else milliwatts / 1000.0


def all_gpus() -> list[GpuInfo]:
    """Every GPU the driver lists, enumerated once per process; ``[]`` without a usable driver.

    The one enumeration of nbtrain: the launcher counts GPUs with it and the telemetry reads the
    changing fields through its handles. Names, UUIDs, totals, power limits and MIG modes do not change
    while a kernel lives, and some of those calls take milliseconds, so they are not asked again.
    """
    lib = library()
    if lib is None:
        return []
    with _enumeration_lock:
        gpus = _state.get("gpus")
        if gpus is None:
            gpus = _state["gpus"] = tuple(_enumerate(lib))
    return list(gpus)


def _enumerate(lib) -> list[GpuInfo]:
    gpus = []
    for index in range(query(lib.nvmlDeviceGetCount, default=0)):
        handle = query(lib.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            continue
        memory = memory_info(lib, handle)
        # Quiet: boards without a power sensor or MIG support answer "not supported", which is no news.
        mig = query(lib.nvmlDeviceGetMigMode, handle, quiet=True)  # (current, pending) or None
        gpus.append(GpuInfo(
            index=index,
            name=text(query(lib.nvmlDeviceGetName, handle, default="GPU")),
            uuid=text(query(lib.nvmlDeviceGetUUID, handle, default="")),
            memory_total=getattr(memory, "total", None),
            power_limit=watts(query(lib.nvmlDeviceGetEnforcedPowerLimit, handle, quiet=True)),
            mig=bool(mig and mig[0] == getattr(lib, "NVML_DEVICE_MIG_ENABLE", 1)),
            handle=handle,
            sm_clock_max=optional(lib, "nvmlDeviceGetMaxClockInfo", handle, 1),  # 1: NVML_CLOCK_SM
            pcie_gen_max=optional(lib, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
            pcie_width_max=optional(lib, "nvmlDeviceGetMaxPcieLinkWidth", handle),
        ))
    return gpus


def visible_gpus(environ=os.environ) -> list[GpuInfo]:
    """The GPUs this process may use, in CUDA's order, honouring ``CUDA_VISIBLE_DEVICES``.

    As CUDA does: entries are indices or UUID prefixes, and the list stops at the first entry that
    names no GPU. MIG instances are not resolved to their parent here (they cannot run NCCL anyway).
    """
    gpus = all_gpus()
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return gpus
    chosen: list[GpuInfo] = []
    for entry in (e.strip() for e in spec.split(",")):
        match = None
        if entry.isdigit():
            match = next((g for g in gpus if g.index == int(entry)), None)
        elif entry.startswith("GPU-"):
            match = next((g for g in gpus if g.uuid.startswith(entry)), None)
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen
