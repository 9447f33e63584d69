"""Reading every GPU's state through NVML, with the fields that never change read once.

:class:`DeviceReader` is the NVML half of :mod:`nbtrain.gpu.telemetry`. Each :meth:`DeviceReader.read`
asks the driver for what changes (utilisation, used memory, temperature, power draw, processes); the
name, UUID, total memory, power limit and MIG mode come from the one enumeration of the GPUs,
:func:`nbtrain.gpu.nvml.all_gpus`, done once per process because some of those calls take
milliseconds and none of them change while a kernel lives.

Everything goes through :func:`nbtrain.gpu.nvml.query` with ``quiet=True``: a field the driver cannot
report (MIG instances have no utilisation counter; some boards have no power sensor) is ``None`` and the
telemetry says so in its notes, rather than a warning every second.

:meth:`GpuStatus.to_json` and :meth:`GpuStatus.from_json` are how a node agent's heartbeat carries a GPU to the
kernel: plain JSON values (the health and MIG instances by their own ``to_json``), each checked on the way back in
(:mod:`nbtrain.gpu.jsonfields`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from . import jsonfields as J
from . import nvml
from .gpm import GpmSampler
from .fabric import MigDevice, MigSlot, NvLinkRates, mig_slots, nvlink_links, read_mig_devices
from .health import GpuHealth, read_health, read_throughput
from .xid import XidWatcher

# More than this in use on a GPU whose driver lists no process: the driver hides them (VMs, some containers).
# An idle board reads a few hundred MiB (the driver's own reservation), a CUDA context alone ~0.5 GiB.
HIDDEN_PROCESSES_FLOOR = 1 << 30
THROUGHPUT_EVERY_S = 10.0
MAX_MIG_DEVICES = 16  # instances of one GPU a heartbeat may list (an H100 has 7 slots)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU, as NVML sees it (PIDs are the driver's: the host's)."""

    pid: int
    used_memory: int | None  # bytes; None when the driver does not report it (MIG, some drivers)


@dataclass(frozen=True)
class GpuStatus:
    """One GPU at one moment. ``None`` means "the driver did not say", shown as N/A."""

    index: int  # NVML (physical) index, as nvidia-smi numbers GPUs
    name: str
    uuid: str
    utilization: int | None  # percent of time a kernel ran in the last sample period
    memory_used: int | None  # bytes
    memory_total: int | None  # bytes
    temperature: int | None  # degrees Celsius
    power: float | None  # watts drawn
    power_limit: float | None  # watts, the enforced limit
    processes: tuple[GpuProcess, ...] | None  # None: NVML could not list them
    mig: bool = False  # MIG mode is on: utilisation and per-process memory are not reported
    health: GpuHealth | None = None  # clocks and what holds them down, the PCIe link, ECC errors (gpu/health.py)
    mig_devices: tuple[MigDevice, ...] = ()  # in MIG mode: each instance, its memory and processes (gpu/fabric.py)

    @property
    def processes_hidden(self) -> bool:
        """The driver lists no process while memory is in use: who holds it is unknown, not "nobody".

        Seen in VMs (an H100 under Firecracker listed nothing while a rank held 8 GiB) and some
        containers; ``memory_used`` is still right, and it is what to read there.
        """
        return self.processes == () and (self.memory_used or 0) > HIDDEN_PROCESSES_FLOOR

    @property
    def memory_fraction(self) -> float | None:
        if self.memory_used is None or not self.memory_total:
            return None
        return self.memory_used / self.memory_total

    def to_json(self) -> dict:
        """This GPU as a node's heartbeat carries it: JSON-safe, its health and MIG instances as dicts of their
        own; its processes stay on the node (their PIDs mean nothing elsewhere)."""
        return {"index": self.index, "name": self.name, "uuid": self.uuid, "utilization": self.utilization,
                "memory_used": self.memory_used, "memory_total": self.memory_total, "temperature": self.temperature,
                "power": self.power, "power_limit": self.power_limit, "mig": self.mig,
                "health": None if self.health is None else self.health.to_json(),
                "mig_devices": [device.to_json() for device in self.mig_devices]}

    @classmethod
    def from_json(cls, data) -> GpuStatus | None:
        """What :meth:`to_json` made, each field checked: one of the wrong type or size reads N/A, a missing one
        too, an unknown one is ignored (a newer agent's); None without an index (or when ``data`` is no dict).
        ``processes`` is None: not known here."""
        if not isinstance(data, dict) or (index := J.whole(data.get("index"))) is None:
            return None
        devices = J.items(data.get("mig_devices"), MAX_MIG_DEVICES) or []
        return cls(index=index, name=J.text(data.get("name")) or "", uuid=J.text(data.get("uuid")) or "",
                   utilization=J.whole(data.get("utilization")), memory_used=J.whole(data.get("memory_used")),
                   memory_total=J.whole(data.get("memory_total")), temperature=J.whole(data.get("temperature")),
                   power=J.number(data.get("power")), power_limit=J.number(data.get("power_limit")), processes=None,
                   mig=data.get("mig") is True, health=GpuHealth.from_json(data.get("health")),
                   mig_devices=tuple(d for d in map(MigDevice.from_json, devices) if d is not None))


class DeviceReader:
    """Reads all GPUs' changing fields: NVML is initialised and the GPUs enumerated on the first :meth:`read`
    (by :func:`nbtrain.gpu.nvml.all_gpus`), never before.

    The PCIe throughput is read only with ``pcie_throughput`` (``%gpus --once``), at most every
    :data:`THROUGHPUT_EVERY_S`: NVML samples it, and on an H200 one call took 62 ms — the live sampler, which
    reads every GPU every second, leaves it out (its other health fields together take about 0.1 ms).

    With ``xid_events`` (a run's dashboard) it also counts each GPU's Xid errors from its first read on, on a
    thread of its own (:class:`~nbtrain.gpu.xid.XidWatcher`), until :meth:`close`. The NVLink links and MIG
    instances are enumerated on the first read of each GPU (:mod:`nbtrain.gpu.fabric`)."""

    def __init__(self, pcie_throughput: bool = False, xid_events: bool = False) -> None:
        self._with_throughput = pcie_throughput
        self._throughput: dict[int, tuple[float, tuple[int | None, int | None]]] = {}  # index -> (when, rx/tx)
        self._xid_events = xid_events
        self._xid: XidWatcher | None = None
        self._links: dict[int, tuple[int | None, str | None]] = {}  # index -> (links up, why N/A)
        self._nvlink: dict[int, NvLinkRates] = {}
        self._mig: dict[int, tuple[MigSlot, ...]] = {}
        self._gpm = GpmSampler()

    def available(self) -> bool:
        return nvml.library() is not None

    def read(self) -> list[GpuStatus]:
        lib = nvml.library()
        if lib is None:
            return []
        gpus = nvml.all_gpus()
        if self._xid_events and self._xid is None:
            self._xid = XidWatcher(lib, gpus)
        return [self._read_one(lib, gpu) for gpu in gpus]

    def close(self) -> None:
        """Stop watching for Xid errors and free the GPM samples (nothing else is held)."""
        if self._xid is not None:
            self._xid.close()
        if (lib := nvml.library()) is not None:
            self._gpm.close(lib)

    def _read_one(self, lib, gpu: nvml.GpuInfo) -> GpuStatus:
        handle = gpu.handle
        rates = nvml.query(lib.nvmlDeviceGetUtilizationRates, handle, quiet=True)
        memory = nvml.memory_info(lib, handle, quiet=True)
        sensor = getattr(lib, "NVML_TEMPERATURE_GPU", 0)
        return GpuStatus(
            index=gpu.index,
            name=gpu.name,
            uuid=gpu.uuid,
            utilization=getattr(rates, "gpu", None),
            memory_used=getattr(memory, "used", None),
            memory_total=gpu.memory_total if gpu.memory_total is not None else getattr(memory, "total", None),
            temperature=nvml.query(lib.nvmlDeviceGetTemperature, handle, sensor, quiet=True),
            power=nvml.watts(nvml.query(lib.nvmlDeviceGetPowerUsage, handle, quiet=True)),
            power_limit=gpu.power_limit,
            processes=self._processes(lib, handle),
            mig=gpu.mig,
            health=read_health(lib, gpu, self._pcie(lib, gpu), **self._read_elsewhere(lib, gpu)),
            mig_devices=self._mig_devices(lib, gpu),
        )

    def _read_elsewhere(self, lib, gpu: nvml.GpuInfo) -> dict:
        """The NVLink, Xid and GPM fields of :class:`~nbtrain.gpu.health.GpuHealth`, with why each reads N/A."""
        if gpu.index not in self._links:
            self._links[gpu.index] = nvlink_links(lib, gpu.handle)
        links, why = self._links[gpu.index]
        unread: list[str] = []
        fields: dict = {"nvlinks": links}
        if why:
            unread.append(f"NVLink: {why}")
        elif links:
            rates = self._nvlink.setdefault(gpu.index, NvLinkRates())
            fields["nvlink_rx"], fields["nvlink_tx"] = rates.read(lib, gpu.handle)
            if rates.reason:
                unread.append(f"NVLink traffic: {rates.reason}")
        if self._xid is not None:
            fields["xid_errors"], fields["xid_last"], why = self._xid.read(gpu.index)
            if why:
                unread.append(f"Xid: {why}")
        activity, why = self._gpm.read(lib, gpu)
        fields.update(activity)
        if why:
            unread.append(why)
        fields["unread"] = tuple(unread)
        return fields

    def _mig_devices(self, lib, gpu: nvml.GpuInfo) -> tuple[MigDevice, ...]:
        if not gpu.mig:
            return ()
        if gpu.index not in self._mig:
            self._mig[gpu.index] = mig_slots(lib, gpu.handle)
        return read_mig_devices(lib, self._mig[gpu.index])

    def _pcie(self, lib, gpu: nvml.GpuInfo) -> tuple[int | None, int | None]:
        if not self._with_throughput:
            return (None, None)
        when, rates = self._throughput.get(gpu.index, (-THROUGHPUT_EVERY_S, (None, None)))
        if time.monotonic() - when >= THROUGHPUT_EVERY_S:
            rates = read_throughput(lib, gpu)
            self._throughput[gpu.index] = (time.monotonic(), rates)
        return rates

    @staticmethod
    def _processes(lib, handle) -> tuple[GpuProcess, ...] | None:
        compute = nvml.query(lib.nvmlDeviceGetComputeRunningProcesses, handle, quiet=True)
        graphics = nvml.query(lib.nvmlDeviceGetGraphicsRunningProcesses, handle, quiet=True)
        if compute is None and graphics is None:
            return None
        seen: dict[int, GpuProcess] = {}
        for proc in list(compute or []) + list(graphics or []):
            pid = int(getattr(proc, "pid", -1))
            if pid >= 0 and pid not in seen:  # a process using both engines is listed twice
                seen[pid] = GpuProcess(pid, getattr(proc, "usedGpuMemory", None))
        return tuple(seen.values())
